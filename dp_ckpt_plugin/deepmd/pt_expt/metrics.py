"""Where the pt_expt trainer shows metrics and saves best files (:mod:`..metrics`).

:class:`MetricsMixin` goes before deepmd-kit's ``Trainer`` in the trainer class
(:mod:`.trainer`). deepmd-kit's pt_expt loop (``AbstractTrainer.run``) calls
``collect_display_results`` on the chief at each displayed step (``step``
0-based), and saves a best-validation checkpoint through
``_save_full_validation_checkpoint`` / ``_save_full_validation_ema_checkpoint``;
the shared :class:`~dp_ckpt_plugin.deepmd.metrics.ReportsMetrics` does the rest.
"""

from __future__ import annotations

from pathlib import Path

from ..metrics import ReportsMetrics


class MetricsMixin(ReportsMetrics):
    """The pt_expt trainer's entries into :class:`ReportsMetrics`."""

    def collect_display_results(self, tasks, *, active_task, step, step_result):
        train, valid = super().collect_display_results(
            tasks, active_task=active_task, step=step, step_result=step_result
        )
        self.dp_note_shown(step + 1, train, valid)
        return train, valid

    def _save_full_validation_checkpoint(
        self, save_path: Path, lr: float = 0.0, step: int = 0
    ) -> None:
        if "full_validator" not in (self._dp_best_families or {}):
            super()._save_full_validation_checkpoint(save_path, lr=lr, step=step)
            return
        state = self._checkpoint_payload(
            step, include_optimizer=True, include_ema_state=True
        )
        self.dp_save_best("full_validator", step, state)

    def _save_full_validation_ema_checkpoint(
        self, save_path: Path, lr: float = 0.0, step: int = 0
    ) -> None:
        if "ema_full_validator" not in (self._dp_best_families or {}):
            super()._save_full_validation_ema_checkpoint(save_path, lr=lr, step=step)
            return
        with self.model_ema.apply_shadow(self.model):
            state = self._checkpoint_payload(
                step, include_optimizer=False, include_ema_state=False
            )
        self.dp_save_best("ema_full_validator", step, state)
