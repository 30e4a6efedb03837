"""A deepmd-kit PyTorch ``Trainer`` (``dp --pt``) whose checkpoints go through the store.

deepmd-kit's ``dp --pt`` loop is one long method; it names, writes, prunes
and publishes checkpoints through two objects, ``trainer.ckpt_store`` and
``trainer.ema_ckpt_store`` (``path_for``, ``publish``, ``prune``), and writes
through ``_write_checkpoint(path, payload, store=...)``. That is where this
host enters, and only there:

- the two stores are replaced by :class:`StoreFamily` views of the plugin's
  store: ``path_for`` names the store's files, ``publish`` and ``prune`` do
  nothing (the store publishes and retains after its commit); the step
  ``path_for`` was given is what the write of that path is saved under (the
  name is never parsed back);
- ``_write_checkpoint`` hands a numbered checkpoint's payload, exactly as
  deepmd-kit assembled it (``model``, ``optimizer``, EMA state; multi-task
  ``model_dict`` runs included), to the store. The periodic payload waits
  for the EMA one of the same step so that both are one save (one save in
  flight, as the pt_expt host), with the learning-curve values displayed at
  that step (``print_on_training``, :class:`~..metrics.ReportsMetrics`). A
  best-validation file goes to the store's ``best.ckpt`` family; any other
  path (an explicit ``validating.save_best_dir``) is written atomically
  where deepmd-kit put it;
- ``lr_schedule`` is wrapped so that its call at the start of each step asks
  whether a stop signal came (:meth:`~..checkpointing.HostRun.check_stop`).

deepmd-kit names numbered files by the steps done (``model.ckpt-20.pt``) but
records ``train_infos.step`` as the index of the last step (19), so a restart
runs that step again. The plugin records the steps done (20), as
``dp --pt-expt`` does: a restart, by the plugin or by plain deepmd-kit,
starts at the next step. Each payload with the optimizer also carries the
plugin's entry (:mod:`..exact`): the random states and the position of the
batches (:mod:`.batches`); at ``--restart`` they are restored.

Without ``save_dir``, deepmd-kit's stores are kept (layout, publication,
pruning) and only the write itself is made atomic.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from deepmd.pt.train import training

from ..checkpointing import HostRun
from ..exact import KEY, LMDB, all_ranks, capture_rngs
from ..metrics import ReportsMetrics
from ..naming import ema_prefix
from ..optimizer_state import load_optimizer_state
from . import batches

log = logging.getLogger("dp_ckpt_plugin")


class StoreFamily:
    """One family of the plugin's store, as deepmd-kit's trainer sees a store.

    Parameters
    ----------
    run : HostRun
        The run whose store this is.
    prefix : str
        The family's prefix (``model.ckpt``, ``model_ema.ckpt``).
    deepmds : deepmd.dpmodel.train.checkpoint.CheckpointStore
        deepmd-kit's own store of the family, which it replaces: a path the
        plugin's store names as deepmd-kit's names it is spelled as deepmd-kit
        spells it (``models/model.ckpt-20.pt``, relative as ``save_dir`` is),
        so deepmd-kit's ``Saved model to`` line says what it says alone.
    """

    def __init__(self, run: HostRun, prefix: str, deepmds: Any) -> None:
        self.run = run
        self.prefix = prefix
        self.deepmds = deepmds
        #: The path :meth:`path_for` built last (absolute) and its step.
        self._built: tuple[Path, int] | None = None

    def path_for(self, step: int) -> Path:
        """Where the checkpoint of ``step`` goes, spelled as deepmd-kit spells it.

        deepmd-kit hands the path back to ``_write_checkpoint``, which asks
        :meth:`step_of` for the step given here rather than parse the name.
        """
        path = self.run.store.path_for(step, self.prefix)
        self._built = (path, step)
        theirs = Path(self.deepmds.path_for(step))
        return theirs if self._absolute(theirs) == path else path

    def _absolute(self, path: Path) -> Path:
        return Path(os.path.normpath(os.path.join(self.run.cwd or "", path)))

    def step_of(self, path: Path) -> int | None:
        """The step :meth:`path_for` last built ``path`` for, else ``None``."""
        built = self._built
        return built[1] if built and self._absolute(Path(path)) == built[0] else None

    def prepare(self) -> None:
        """The store creates its directory itself."""

    def publish(self, path: Path) -> None:
        """The store publishes after its commit."""

    def prune(self, current: Path) -> None:
        """The store applies retention after its commit."""


def make_trainer_class(host_run: HostRun) -> type:
    """Return a subclass of deepmd-kit's ``dp --pt`` ``Trainer`` bound to ``host_run``."""

    class CheckpointingTrainer(ReportsMetrics, training.Trainer):
        """deepmd-kit's PyTorch trainer writing through dp_ckpt_plugin."""

        dp_run = host_run
        _dp_step = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with cpu_distributed():
                host_run.build(
                    lambda: super(CheckpointingTrainer, self).__init__(*args, **kwargs)
                )
            # deepmd-kit's constructor read config["training"]: a normalized input
            config = args[0] if args else kwargs["config"]
            host_run.training = config["training"]  # with deepmd-kit's defaults
            host_run.started(self.num_steps)
            self._dp_loaders = batches.loaders_of(self)
            self._dp_gathered: tuple[int, list[dict[str, Any]]] | None = None
            if self.world_size > 1 and hasattr(self, "nonfinite_grad_guard"):
                self.nonfinite_grad_guard = GatherBeforeSave(
                    self, self.nonfinite_grad_guard
                )
            unsupported = LMDB if self._dp_loaders is None else None
            self._dp_exact = host_run.exact(self.rank, self.world_size, unsupported)
            if self._dp_exact.enabled and not self._dp_exact.active and self.rank == 0:
                log.info(
                    "exact resume is not available in this run: %s; a restart "
                    "from its checkpoints draws fresh batches",
                    self._dp_exact.unsupported,
                )
            # a restart from a checkpoint this plugin wrote starts at the step
            # after its steps done; one plain deepmd-kit wrote runs its last
            # step again (its train_infos.step is that step's index)
            self._dp_redoes_step = False
            restart = kwargs.get("restart_model")
            if self.restart_training and restart:
                entry = host_run.restore(
                    restart,
                    self._dp_exact,
                    lambda saved: batches.restore(self._dp_loaders, saved),
                    step=self.start_step,
                )
                self._dp_redoes_step = not isinstance(entry, dict)
            self._dp_pending: tuple[int, dict[str, Any]] | None = None
            if host_run.store is not None:
                primary, ema = host_run.family_names(self.model_ema is not None)
                self.ckpt_store = StoreFamily(host_run, primary, self.ckpt_store)
                self.ema_ckpt_store = StoreFamily(
                    host_run, ema_prefix(primary), self.ema_ckpt_store
                )
                self._dp_primary, self._dp_ema = primary, ema
            self.dp_setup_best(
                config.get("validating"),
                disp_freq=self.disp_freq,
                save_freq=self.save_freq,
            )

        def _load_optimizer_state(self, optimizer_state_dict) -> None:
            # re-keyed across zero_stage forms; FSDP2 without deepmd-kit's bug
            if optimizer_state_dict is None or not self.restart_training:
                return
            load_optimizer_state(
                self,
                optimizer_state_dict,
                module=self._get_inner_module(),
                load=super()._load_optimizer_state,
            )

        # -- exact resume -----------------------------------------------------
        def _dp_local_state(self) -> dict[str, Any]:
            return {"rng": capture_rngs(), "data": batches.capture(self._dp_loaders)}

        def _dp_gather(self, step: int) -> None:
            """Every rank's state at ``step`` steps done, for the chief's save.

            Called collectively by every rank right before a save (the ranks
            draw their own batches: each is seeded with its rank).
            """
            if self.world_size > 1 and self._dp_exact.active:
                self._dp_gathered = (step, all_ranks(self._dp_local_state()))

        def save_model(self, save_path, lr=0.0, step=0, **kwargs) -> None:
            # train_infos.step: the steps done (deepmd-kit passes the last
            # step's index), so that a restart starts at the next step
            self._dp_step = step + 1
            super().save_model(save_path, lr=lr, step=step + 1, **kwargs)

        def save_model_merged(self, save_path, lr=0.0, step=0, **kwargs) -> None:
            self._dp_step = step + 1
            super().save_model_merged(save_path, lr=lr, step=step + 1, **kwargs)

        def _dp_add_entry(self, data: dict[str, Any]) -> None:
            """The plugin's entry, in the payload that carries the optimizer."""
            if "optimizer" not in data:
                return
            step, local, gather = self._dp_step, self._dp_local_state, None
            if self.world_size > 1:
                gathered = self._dp_gathered
                if gathered is not None and gathered[0] == step:
                    gather = lambda mine: gathered[1]  # noqa: E731 (gathered before)
                else:  # a save the chief makes alone: the step only
                    local = None
            data[KEY] = self._dp_exact.payload_entry(step, local, gather)

        # -- writing --------------------------------------------------------
        def _write_checkpoint(
            self, save_path: Path, checkpoint_data: dict[str, Any], *, store
        ) -> None:
            if self.rank == 0:
                self._dp_add_entry(checkpoint_data)
                _float_lr(checkpoint_data)
            best = self.dp_best_attribute(save_path)
            if best is not None:
                self.dp_save_best(*best, checkpoint_data)
                return
            step = store.step_of(save_path) if isinstance(store, StoreFamily) else None
            if step is not None:
                self._stage(step, store.prefix, checkpoint_data)
            elif self.rank == 0:  # a file outside the store, made atomic
                host_run.write_atomic(save_path, checkpoint_data)
                if not isinstance(store, StoreFamily):  # deepmd-kit's, no save_dir
                    store.prune(Path(save_path))

        def _stage(self, step: int, prefix: str, data: dict[str, Any]) -> None:
            """Save the payloads of a step once every family's is there."""
            pending = self._dp_pending
            if pending is not None and (pending[0] != step or prefix in pending[1]):
                self._dp_flush()  # a lone payload: never lost
                pending = None
            states = {**(pending[1] if pending else {}), prefix: data}
            wanted = {self._dp_primary, self._dp_ema} - {None}
            if set(states) >= wanted or prefix != self._dp_primary:
                self._dp_pending = None
                self._dp_commit(step, states)
            else:
                self._dp_pending = (step, states)

        def _dp_flush(self) -> None:
            pending, self._dp_pending = self._dp_pending, None
            if pending is not None:
                self._dp_commit(*pending)

        def _dp_commit(self, step: int, states: dict[str, Any]) -> None:
            metrics = {self._dp_primary: self.dp_metrics(step)}
            host_run.save(step, states, metrics=metrics)

        def print_on_training(
            self, fout, step_id, cur_lr, train_results, valid_results
        ) -> None:
            # the row of lcurve.out, on the chief, before that step's save
            super().print_on_training(
                fout, step_id, cur_lr, train_results, valid_results
            )
            self.dp_note_shown(step_id, train_results, valid_results)

        # -- the loop ---------------------------------------------------------
        def run(self) -> None:
            host_run.loop_started()
            self.lr_schedule = StepGate(self, self.lr_schedule)
            try:
                super().run()
                if host_run.store is not None:
                    self._dp_flush()
            finally:
                self.lr_schedule = self.lr_schedule.schedule
            host_run.finish()

        def _dp_check_stop(self, step_id: int) -> None:
            # a restart from plain deepmd-kit's checkpoint re-trains the step it
            # resumed from: that one is done
            start = self.start_step + 1 if self._dp_redoes_step else self.start_step
            host_run.check_stop(step_id, start_step=start, save=self._dp_save)

        def _dp_save(self, display_step: int) -> None:
            """Save the steps done as deepmd-kit's loop saves them (every rank calls it)."""
            self._dp_gather(display_step)
            if not (self.sharding.enabled or self.rank == 0):
                return
            schedule = getattr(self.lr_schedule, "schedule", self.lr_schedule)
            lr = schedule.value(display_step - 1)
            self.latest_model = self.ckpt_store.path_for(display_step)
            # deepmd-kit's loop saves with the last step's index (save_model adds one)
            self.save_model(self.latest_model, lr=lr, step=display_step - 1)
            if self.rank == 0:
                self.ckpt_store.publish(self.latest_model)
            if self.model_ema is not None:
                self.latest_ema_model = self.ema_ckpt_store.path_for(display_step)
                self.save_ema_model(self.latest_ema_model, lr=lr, step=display_step - 1)
                if self.rank == 0:
                    self.ema_ckpt_store.publish(self.latest_ema_model)

    return CheckpointingTrainer


class GatherBeforeSave:
    """deepmd-kit's non-finite gradient guard, gathering every rank's state first.

    deepmd-kit's ``dp --pt`` loop calls ``raise_if_nonfinite`` on every rank
    right before each periodic save (the chief alone writes): the one place
    where all ranks meet with the step's batches drawn.
    """

    def __init__(self, trainer, guard) -> None:
        self.trainer = trainer
        self.guard = guard

    def raise_if_nonfinite(self, *args: Any, **kwargs: Any) -> Any:
        done = self.guard.raise_if_nonfinite(*args, **kwargs)
        self.trainer._dp_gather(self.trainer.lr_schedule.next_step)
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self.guard, name)


class StepGate:
    """deepmd-kit's learning-rate schedule, asking for a stop at each step.

    deepmd-kit's ``dp --pt`` loop calls ``lr_schedule.value(step_id)`` first
    in every step, on every rank, in order; other calls (the bias re-save
    after the loop, on rank 0 only) ask for another step and pass through.
    """

    def __init__(self, trainer, schedule) -> None:
        self.trainer = trainer
        self.schedule = schedule
        self.next_step = trainer.start_step

    def value(self, step_id: int) -> float:
        if step_id == self.next_step and step_id < self.trainer.num_steps:
            self.next_step += 1
            self.trainer._dp_check_stop(step_id)
        return self.schedule.value(step_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.schedule, name)


def _float_lr(data: dict[str, Any]) -> None:
    """What deepmd-kit's ``_write_checkpoint`` does to the payload before saving."""
    optim_state = data.get("optimizer")
    if optim_state is not None:
        for item in optim_state["param_groups"]:
            item["lr"] = float(item["lr"])


@contextlib.contextmanager
def cpu_distributed():
    """Let deepmd-kit's ``dp --pt`` trainer start under torch.distributed without a GPU.

    deepmd-kit 3.2 calls ``torch.cuda.set_device(LOCAL_RANK)`` and wraps the
    model in ``DDP(device_ids=[LOCAL_RANK])``, both of which fail on a CPU.
    Without CUDA, for the trainer's constructor only, the first does nothing
    and the second gets no device ids (DDP's CPU form).
    """
    import torch

    if torch.cuda.is_available():
        yield
        return
    real_ddp = training.DDP

    def ddp_on_cpu(module, *args, device_ids=None, output_device=None, **kwargs):
        return real_ddp(module, *args, **kwargs)

    old_set_device = torch.cuda.set_device
    training.DDP = ddp_on_cpu
    torch.cuda.set_device = lambda device: None
    try:
        yield
    finally:
        training.DDP = real_ddp
        torch.cuda.set_device = old_set_device
