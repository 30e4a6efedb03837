"""A deepmd-kit pt_expt ``Trainer`` whose checkpoints go through the store.

Two methods of deepmd-kit's trainer are overridden:

- ``save_checkpoint`` assembles the same payload deepmd-kit writes (model,
  optimizer, EMA state, with ``train_infos.step`` set) for the periodic and the
  EMA family and hands each to the store by family and step, which commits,
  publishes and prunes it. deepmd-kit's own checkpoint stores are left unused;
- ``_write_checkpoint`` (reached only for best-validation files now) writes
  the same payload atomically at the exact path given, which keeps its own
  name and place.

Without ``save_dir``, deepmd-kit's layout, publication and pruning are kept and
only the write itself is made atomic.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from deepmd.pt_expt.train import training
from deepmd.pt_expt.train.ema import EMA_CHECKPOINT_KEY

from ... import fsio
from ...errors import CheckpointError
from ...store import CheckpointStore
from ..naming import ema_prefix
from .metrics import MetricsMixin

log = logging.getLogger("dp_ckpt_plugin.deepmd")


def make_trainer_class(
    store: CheckpointStore | None,
    training_params: dict[str, Any],
    *,
    resumed_from: Path | None = None,
    background: bool = False,
    retention: dict[str, Any] | None = None,
) -> type:
    """Return a subclass of deepmd-kit's pt_expt ``Trainer`` bound to ``store``.

    Parameters
    ----------
    store : CheckpointStore or None
        The store of ``save_dir``; ``None`` keeps deepmd-kit's layout.
    training_params : dict
        The normalized ``training`` section (retention keys).
    resumed_from : Path, optional
        The checkpoint the run starts from (its protection is set up by
        :func:`dp_ckpt_plugin.deepmd.prepare.prepare_run`), named when it does
        not fit the model.
    background : bool, optional
        Whether periodic saves run in the store's background writer.
    retention : dict, optional
        The ``dp_ckpt/retention`` options (:mod:`..retention_args`).
    """

    class CheckpointingTrainer(MetricsMixin, training.Trainer):
        """deepmd-kit's pt_expt trainer writing through dp_ckpt_plugin."""

        dp_store = store

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().__init__(*args, **kwargs)
            except RuntimeError as exc:
                mismatch = describe_mismatch(str(exc))
                if resumed_from is None or mismatch is None:
                    raise
                raise CheckpointError(
                    f"checkpoint {resumed_from} does not fit the model of this "
                    f"input: {mismatch}. Nothing was changed; restart from a "
                    "checkpoint of this model, or use --finetune"
                ) from None
            config = args[0] if args else kwargs.get("config", {})
            self.dp_setup_retention(
                training_params, retention, (config or {}).get("validating")
            )

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
            return state

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
                write_torch_atomic(
                    Path(ckpt_path),
                    state,
                    durable=self.dp_store.durable if self.dp_store else True,
                )

        # -- the periodic save ------------------------------------------------
        def save_checkpoint(self, step: int) -> None:
            if self.dp_store is None:
                super().save_checkpoint(step)
                return
            self.nonfinite_grad_guard.raise_if_nonfinite(self.wrapper.named_parameters)
            primary = self.dp_store.primary.prefix
            states = {
                primary: self._checkpoint_payload(
                    step, include_optimizer=True, include_ema_state=True
                )
            }
            if self.model_ema is not None:
                with self.model_ema.apply_shadow(self.model):
                    states[ema_prefix(primary)] = self._checkpoint_payload(
                        step, include_optimizer=False, include_ema_state=False
                    )
            # the periodic and EMA payloads go together: one save in flight
            paths = self.dp_store.save_all(
                step,
                states,
                background=background,
                metrics={primary: self.dp_metrics(step)},
            )
            if self.rank == 0:
                log.info("Saved model to %s", paths[primary])

    return CheckpointingTrainer


_MISMATCH = (
    (
        re.compile(
            r"size mismatch for ([^:]+): copying a param with shape (.+?) from "
            r"checkpoint, the shape in current model is (.+?)\.?$"
        ),
        "parameter {0} has shape {1} in the checkpoint but {2} in the model",
    ),
    (
        re.compile(r'Missing key\(s\) in state_dict: "([^"]+)"'),
        "parameter {0} of the model is not in the checkpoint",
    ),
    (
        re.compile(r'Unexpected key\(s\) in state_dict: "([^"]+)"'),
        "the checkpoint holds parameter {0}, which the model does not have",
    ),
)


def describe_mismatch(text: str) -> str | None:
    """Name the first parameter a ``load_state_dict`` error says differs."""
    for line in text.splitlines():
        for pattern, message in _MISMATCH:
            found = pattern.search(line.strip())
            if found:
                return message.format(*found.groups())
    return None


def write_torch_atomic(path: Path, state: Any, *, durable: bool = True) -> None:
    """``torch.save`` to ``path`` through a temporary name, fsynced, then ``os.replace``."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_file_atomic(
        path, lambda handle: torch.save(state, handle), durable=durable
    )
