"""What the pt_expt trainer tells the store beyond payloads: metrics and best files.

:class:`MetricsMixin` goes before deepmd-kit's ``Trainer`` in the trainer class
(:mod:`.trainer`) and, when ``save_dir`` is set,

- remembers the values of the learning-curve row displayed at each step
  (``rmse_val``, ``rmse_e_trn``, ... as ``lcurve.out`` names them), which the
  periodic save of the same step records (``training/_dp_ckpt/retention/keep_best``
  ranks by them);
- writes the best-validation checkpoints of ``validating.full_validation``
  into ``save_dir`` as the families ``best.ckpt`` and ``best_ema.ckpt``
  (``D/best.ckpt-<step>.pt``), committed like any checkpoint, recording the
  validation metric, kept by ``validating.max_best_ckpt`` (best first), with
  ``D/checkpoint.best.ckpt`` and ``D/best.ckpt.pt`` naming the best one, and
  resolvable as ``--restart best``. An explicit ``validating.save_best_dir``
  keeps deepmd-kit's own files there instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

from ...layout import Family
from ...store import FamilyConfig
from ..checkpointing import HostRun
from ..retention_args import best_policy, display_metrics

log = logging.getLogger("dp_ckpt_plugin.deepmd")

#: deepmd-kit's prefixes of best-validation checkpoints (live and EMA weights).
BEST_PREFIX = "best.ckpt"
EMA_BEST_PREFIX = "best_ema.ckpt"


class MetricsMixin:
    """Metrics with periodic saves, best-validation checkpoints into the store.

    The trainer class sets :attr:`dp_run` (whose ``store`` is ``None`` without
    ``save_dir``: deepmd-kit's own behaviour) and calls :meth:`dp_setup_best`
    once deepmd-kit's ``__init__`` has run and the families' policies are set.
    """

    dp_run: HostRun
    _dp_shown: tuple[int, dict[str, float]] | None = None
    _dp_best_families: ClassVar[dict[str, str]] = {}

    # -- set-up ---------------------------------------------------------------
    def dp_setup_best(self, validating: dict[str, Any] | None) -> None:
        """Add the best families when they belong in the store."""
        store = self.dp_run.store
        if store is None:
            return
        if (self.dp_run.retention or {}).get("keep_best"):
            display, save = self.trainer_config.disp_freq, self.trainer_config.save_freq
            if display <= 0 or save <= 0 or save % display:
                log.warning(
                    "training/_dp_ckpt/retention/keep_best ranks periodic checkpoints by the "
                    "metrics displayed at their step, but training.save_freq (%d) is "
                    "not a multiple of training.disp_freq (%d): only the final "
                    "checkpoint may record them",
                    save,
                    display,
                )
        self._dp_best_families = {}
        for attribute, prefix in (
            ("full_validator", BEST_PREFIX),
            ("ema_full_validator", EMA_BEST_PREFIX),
        ):
            validator = getattr(self, attribute, None)
            if validator is None or not validator.save_best:
                continue
            if (validating or {}).get("save_best_dir"):
                continue  # the user named a place: deepmd-kit's own files there
            store.add_family(
                FamilyConfig(
                    Family(prefix, store.primary.suffix, f"checkpoint.{prefix}"),
                    best_policy(validator.max_best_ckpt, validator.metric_name),
                )
            )
            validator.emit_best_save_log = False  # its path is not where we write
            self._dp_best_families[attribute] = prefix

    # -- metrics of periodic saves -------------------------------------------------
    def collect_display_results(self, tasks, *, active_task, step, step_result):
        train, valid = super().collect_display_results(
            tasks, active_task=active_task, step=step, step_result=step_result
        )
        if self.dp_run.store is not None:
            self._dp_shown = (step + 1, display_metrics(train, valid))
        return train, valid

    def dp_metrics(self, step: int) -> dict[str, float] | None:
        """The values displayed at ``step``, if it was a display step."""
        if self._dp_shown is not None and self._dp_shown[0] == step:
            return self._dp_shown[1]
        return None

    # -- best-validation checkpoints ---------------------------------------------------
    def _save_full_validation_checkpoint(
        self, save_path: Path, lr: float = 0.0, step: int = 0
    ) -> None:
        if "full_validator" not in self._dp_best_families:
            super()._save_full_validation_checkpoint(save_path, lr=lr, step=step)
            return
        self._dp_save_best("full_validator", step, ema_weights=False)

    def _save_full_validation_ema_checkpoint(
        self, save_path: Path, lr: float = 0.0, step: int = 0
    ) -> None:
        if "ema_full_validator" not in self._dp_best_families:
            super()._save_full_validation_ema_checkpoint(save_path, lr=lr, step=step)
            return
        self._dp_save_best("ema_full_validator", step, ema_weights=True)

    def _dp_save_best(self, attribute: str, step: int, *, ema_weights: bool) -> None:
        """Save the payload deepmd-kit writes for a best checkpoint into the store."""
        validator = getattr(self, attribute)
        value = next((r.metric for r in validator.topk_records if r.step == step), None)
        if ema_weights:
            with self.model_ema.apply_shadow(self.model):
                state = self._checkpoint_payload(
                    step, include_optimizer=False, include_ema_state=False
                )
        else:
            state = self._checkpoint_payload(
                step, include_optimizer=True, include_ema_state=True
            )
        prefix = self._dp_best_families[attribute]
        metrics = {validator.metric_name: value} if value is not None else None
        path = self.dp_run.store.save(step, state, family=prefix, metrics=metrics)
        log.info("Saved best model to %s (%s = %s)", path, validator.metric_name, value)
