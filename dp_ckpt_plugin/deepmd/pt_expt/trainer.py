"""A deepmd-kit pt_expt ``Trainer`` whose checkpoints go through the store.

What differs from the ``dp --pt`` host is only where deepmd-kit's pt_expt
trainer can be entered:

- ``save_checkpoint(step)`` assembles the same payload deepmd-kit writes
  (model, optimizer, EMA state, with ``train_infos.step`` set) for the
  periodic and the EMA family and hands both to the store
  (:meth:`~dp_ckpt_plugin.deepmd.checkpointing.HostRun.save`), which commits,
  publishes and prunes them, and deepmd-kit's ``Saved model to`` line is said
  as deepmd-kit says it. deepmd-kit's own checkpoint stores are left unused
  (but for the spelling of that line's path);
- ``_write_checkpoint`` (reached only for best-validation files now) writes
  the same payload atomically at the exact path given, which keeps its own
  name and place;
- ``train_step`` first asks whether a stop signal came
  (:meth:`~dp_ckpt_plugin.deepmd.checkpointing.HostRun.check_stop`);
- ``run`` marks the start of the loop and says at the end where the latest
  checkpoint is;
- :class:`~..metrics.ReportsMetrics` records the displayed learning-curve values
  with each periodic checkpoint, and writes best-validation checkpoints into
  ``save_dir`` as the ``best.ckpt`` family;
- exact resume (:mod:`..exact`): the constructor has each data system
  record its frame order (:func:`..positions.track`) before any batch is
  drawn and, at ``--restart``, puts the generators and the data back where
  the checkpoint left them; each periodic save gathers every rank's random
  and data state (every rank then takes part in the save) into the payload
  with the optimizer.

Without ``save_dir``, deepmd-kit's layout, publication and pruning are kept and
only the write itself is made atomic.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from deepmd.pt_expt.train import training
from deepmd.pt_expt.train.ema import EMA_CHECKPOINT_KEY

from .. import positions
from ..checkpointing import HostRun
from ..exact import KEY, LMDB, all_ranks, capture_rngs
from ..logs import say_saved
from ..metrics import ReportsMetrics
from ..optimizer_state import load_optimizer_state


def make_trainer_class(host_run: HostRun) -> type:
    """Return a subclass of deepmd-kit's pt_expt ``Trainer`` bound to ``host_run``."""

    class CheckpointingTrainer(ReportsMetrics, training.Trainer):
        """deepmd-kit's pt_expt trainer writing through dp_ckpt_plugin."""

        dp_run = host_run

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            data = [_arg(args, kwargs, 1, "training_data")]
            data.append(_arg(args, kwargs, 3, "validation_data"))
            systems = [s for d in data for s in _systems_of(d)]
            unsupported = None
            if not all(positions.supported(s) for s in systems):
                unsupported = LMDB
            elif host_run.exact_resume:
                for system in systems:
                    positions.track(system)  # before any batch is drawn
            self._dp_entry: dict[str, Any] | None = None
            host_run.build(
                lambda: super(CheckpointingTrainer, self).__init__(*args, **kwargs)
            )
            host_run.started(self.num_steps)
            self._dp_exact = host_run.exact(self.rank, self.world_size, unsupported)
            restart = kwargs.get("restart_model")
            if self.restart_training and restart and not restart.endswith(".pte"):
                host_run.restore(
                    restart,
                    self._dp_exact,
                    self._dp_restore_data,
                    step=self.start_step,
                )
            config = args[0] if args else kwargs["config"]  # as deepmd-kit read it
            self.dp_setup_best(
                config.get("validating"),
                disp_freq=self.trainer_config.disp_freq,
                save_freq=self.trainer_config.save_freq,
            )

        def _load_optimizer_state(self, optimizer_state_dict) -> None:
            # re-keyed across zero_stage forms; FSDP2 without deepmd-kit's bug
            load_optimizer_state(
                self,
                optimizer_state_dict,
                module=self._unwrapped,
                load=super()._load_optimizer_state,
            )

        # -- exact resume ---------------------------------------------------
        @property
        def checkpoint_is_collective(self) -> bool:
            # every rank hands its random and data state to the chief's save
            exact = getattr(self, "_dp_exact", None)
            return super().checkpoint_is_collective or bool(
                exact is not None and exact.active and self.is_distributed
            )

        def _dp_data(self) -> tuple[tuple[str, dict[str, Any]], ...]:
            return (
                ("train", self.training_data_by_task),
                ("valid", self.validation_data_by_task),
            )

        def _dp_local_state(self) -> dict[str, Any]:
            return {
                "rng": capture_rngs(),
                "data": {
                    kind: {
                        key: positions.capture(by_task.get(key))
                        for key in self.model_keys
                    }
                    for kind, by_task in self._dp_data()
                },
            }

        def _change_bias_after_training(self) -> None:
            # deepmd-kit saves the result on the chief alone: no gather then
            self._dp_chief_alone = True
            super()._change_bias_after_training()

        def _dp_restore_data(self, saved: dict[str, Any]) -> str | None:
            """Put the data where the checkpoint left them; return why not, or ``None``."""
            for kind, by_task in self._dp_data():
                for key in self.model_keys:
                    found = saved.get(kind, {}).get(key)
                    why = positions.restore(by_task.get(key), found)
                    if why is not None:
                        return why
            return None

        # -- the payload --------------------------------------------------
        def _checkpoint_payload(
            self, step: int, *, include_optimizer: bool, include_ema_state: bool
        ) -> dict[str, Any] | None:
            """Build what deepmd-kit's ``_write_checkpoint`` passes to ``torch.save``.

            Every rank takes part (the state collection may be collective); the
            chief gets the payload, other ranks ``None``.
            """
            self._unwrapped.train_infos["step"] = step
            wrapper = self._unwrapped
            compiled_backup = {}
            for task_key in list(wrapper.model.keys()):
                module = wrapper.model[task_key]
                if isinstance(module, training._CompiledModel):
                    compiled_backup[task_key] = module
                    wrapper.model[task_key] = module.original_model
            try:
                model_state, optim_state = self._collect_checkpoint_states(
                    wrapper, include_optimizer=include_optimizer
                )
            finally:
                for task_key, compiled in compiled_backup.items():
                    wrapper.model[task_key] = compiled
            if self.rank != 0:
                return None
            state: dict[str, Any] = {"model": model_state}
            if optim_state is not None:
                state["optimizer"] = optim_state
            if include_ema_state and self.model_ema is not None:
                state[EMA_CHECKPOINT_KEY] = self.model_ema.state_dict()
            if include_optimizer and self._dp_entry is not None:
                state[KEY] = self._dp_entry
            return state

        def _dp_payload(self, step: int, *, ema: bool = False) -> dict[str, Any] | None:
            """The periodic payload of ``step``, or with ``ema`` the EMA weights' one."""
            weights = self.model_ema.apply_shadow(self.model) if ema else nullcontext()
            with weights:
                return self._checkpoint_payload(
                    step, include_optimizer=not ema, include_ema_state=not ema
                )

        def _write_checkpoint(
            self,
            ckpt_path: Path,
            *,
            step: int,
            include_optimizer: bool = True,
            include_ema_state: bool = True,
        ) -> None:
            state = self._checkpoint_payload(
                step,
                include_optimizer=include_optimizer,
                include_ema_state=include_ema_state,
            )
            if state is not None:
                host_run.write_atomic(ckpt_path, state)

        # -- the periodic save ------------------------------------------------
        def save_checkpoint(self, step: int) -> None:
            # every participating rank, before any payload: the gather is collective
            alone = self.is_distributed and getattr(self, "_dp_chief_alone", False)
            self._dp_entry = self._dp_exact.payload_entry(
                step, None if alone else self._dp_local_state, all_ranks
            )
            try:
                self._dp_save_checkpoint(step)
            finally:
                self._dp_entry = None

        def _dp_save_checkpoint(self, step: int) -> None:
            if host_run.store is None:
                host_run.last_saved = step
                super().save_checkpoint(step)
                return
            self.nonfinite_grad_guard.raise_if_nonfinite(self.wrapper.named_parameters)
            primary, ema = host_run.family_names(self.model_ema is not None)
            states = {primary: self._dp_payload(step)}
            if ema is not None:
                states[ema] = self._dp_payload(step, ema=True)
            # the periodic and EMA payloads go together: one save in flight
            host_run.save(step, states, metrics={primary: self.dp_metrics(step)})
            if self.rank == 0:  # its path as deepmd-kit's unused store spells it
                say_saved(host_run.host, self.ckpt_store.path_for(step))

        # -- metrics and best-validation checkpoints (:mod:`..metrics`) ---------
        # deepmd-kit's loop shows a row through collect_display_results
        # (``step`` 0-based) and saves a best-validation checkpoint through
        # _save_full_validation_checkpoint and its EMA twin
        def collect_display_results(self, tasks, *, active_task, step, step_result):
            train, valid = super().collect_display_results(
                tasks, active_task=active_task, step=step, step_result=step_result
            )
            self.dp_note_shown(step + 1, train, valid)
            return train, valid

        def _save_full_validation_checkpoint(self, save_path, lr=0.0, step=0) -> None:
            if not self._dp_save_best("full_validator", step):
                super()._save_full_validation_checkpoint(save_path, lr=lr, step=step)

        def _save_full_validation_ema_checkpoint(self, save_path, lr=0.0, step=0):
            if not self._dp_save_best("ema_full_validator", step):
                super()._save_full_validation_ema_checkpoint(
                    save_path, lr=lr, step=step
                )

        def _dp_save_best(self, attribute: str, step: int) -> bool:
            """Commit a best-validation payload; ``False`` for a file not in the store."""
            if attribute not in (self._dp_best_families or {}):
                return False
            ema = attribute.startswith("ema_")
            self.dp_save_best(attribute, step, self._dp_payload(step, ema=ema))
            return True

        # -- the loop ---------------------------------------------------------
        def train_step(self, task, step: int):
            host_run.check_stop(step, start_step=self.start_step, save=self._stop_save)
            return super().train_step(task, step)

        def _stop_save(self, step: int) -> None:
            if self._participates_in_checkpoint():
                self.save_checkpoint(step)

        def run(self) -> None:
            host_run.loop_started()
            super().run()
            host_run.finish()

    return CheckpointingTrainer


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _systems_of(data: Any) -> list[Any]:
    """The data systems of a trainer argument (one, or one per task)."""
    found = data.values() if isinstance(data, dict) else [data]
    return [d for d in found if d is not None]
