"""What a trainer tells the store beyond payloads, shared by every host: metrics, best files.

:class:`ReportsMetrics` goes before deepmd-kit's ``Trainer`` in a host's
trainer class and, when ``save_dir`` is set,

- remembers the values of the learning-curve row displayed at a step
  (``rmse_val``, ``rmse_e_trn``, ... as ``lcurve.out`` names them;
  ``rmse_val_<task>`` in a multi-task run), which the periodic save of the
  same step records (``training/_dp_ckpt/retention/keep_best`` ranks by them).
  The host says where a row is displayed: ``collect_display_results`` in
  pt_expt, ``print_on_training`` in pt (:meth:`dp_note_shown`);
- makes the best-validation checkpoints of ``validating.full_validation``
  (and ``ema_full_validation``) the families ``best.ckpt`` and
  ``best_ema.ckpt`` of ``save_dir`` (``D/best.ckpt-<step>.pt``), committed
  like any checkpoint, recording the validation metric, kept by
  ``validating.max_best_ckpt`` (best first), with ``D/checkpoint.best.ckpt``
  and ``D/best.ckpt.pt`` naming the best one, and resolvable as
  ``--restart best``. An explicit ``validating.save_best_dir`` keeps
  deepmd-kit's own files there instead.

Both deepmd-kit backends use the same validator class
(``deepmd.pt_expt.train.validation.FullValidator``); only how its payload is
made differs, so a host hands :meth:`dp_save_best` the payload it made.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..checkpoint.layout import Family
from ..errors import ConfigError
from ..store.core import FamilyConfig
from .checkpointing import HostRun
from .retention_args import best_policy, display_metrics

log = logging.getLogger("dp_ckpt_plugin")

#: deepmd-kit's prefixes of best-validation checkpoints (live and EMA weights),
#: by the trainer attribute holding their validator.
BEST_FAMILIES = {"full_validator": "best.ckpt", "ema_full_validator": "best_ema.ckpt"}


class ReportsMetrics:
    """Metrics with periodic saves, best-validation checkpoints into the store.

    The trainer class sets :attr:`dp_run` (whose ``store`` is ``None`` without
    ``save_dir``: deepmd-kit's own behaviour) and calls :meth:`dp_setup_best`
    once deepmd-kit's ``__init__`` has run and the families' policies are set.
    """

    dp_run: HostRun
    _dp_shown: tuple[int, dict[str, float]] | None = None
    _dp_best_families: dict[str, str] | None = None

    # -- set-up ---------------------------------------------------------------
    def dp_setup_best(
        self, validating: Mapping[str, Any] | None, *, disp_freq: int, save_freq: int
    ) -> None:
        """Add the best families when they belong in the store."""
        store = self.dp_run.store
        self._dp_best_families = {}
        if store is None:
            return
        if (self.dp_run.retention or {}).get("keep_best") and (
            disp_freq <= 0 or save_freq <= 0 or save_freq % disp_freq
        ):
            log.warning(
                "training/_dp_ckpt/retention/keep_best ranks periodic checkpoints by "
                "the metrics displayed at their step, but training.save_freq (%d) is "
                "not a multiple of training.disp_freq (%d): only the final "
                "checkpoint may record them",
                save_freq,
                disp_freq,
            )
        if (validating or {}).get("save_best_dir"):
            return  # the user named a place: deepmd-kit's own files there
        for attribute, prefix in BEST_FAMILIES.items():
            validator = getattr(self, attribute, None)
            if validator is None or not validator.save_best:
                continue
            store.add_family(
                FamilyConfig(
                    Family(prefix, store.primary.suffix, f"checkpoint.{prefix}"),
                    best_policy(validator.max_best_ckpt, validator.metric_name),
                )
            )
            validator.emit_best_save_log = False  # its path is not where we write
            self._dp_best_families[attribute] = prefix

    # -- metrics of periodic saves -------------------------------------------------
    def dp_note_shown(
        self, step: int, train: Mapping[str, Any], valid: Mapping[str, Any] | None
    ) -> None:
        """The learning-curve row of (1-based) ``step`` was displayed."""
        if self.dp_run.store is not None:
            self._dp_shown = (step, display_metrics(train, valid))

    def dp_metrics(self, step: int) -> dict[str, float] | None:
        """The values displayed at ``step``, if it was a display step."""
        if self._dp_shown is not None and self._dp_shown[0] == step:
            return self._dp_shown[1]
        return None

    # -- best-validation checkpoints ---------------------------------------------------
    def dp_best_attribute(self, path: Path) -> tuple[str, int] | None:
        """The validator whose best file ``path`` is, and its step; else ``None``.

        Only a file deepmd-kit names in the validator's own directory
        (``best.ckpt-<step>.t-<rank>.pt``) of a family the store took over.
        """
        path = Path(path)
        for attribute in self._dp_best_families or {}:
            validator = getattr(self, attribute)
            found = validator.best_checkpoint_pattern.match(path.name)
            if found and path.parent == Path(validator.checkpoint_dir):
                return attribute, int(found[1])
        return None

    def dp_save_best(self, attribute: str, step: int, state: Any) -> Path | None:
        """Commit the payload of a best checkpoint of (display) ``step``."""
        validator = getattr(self, attribute)
        value = next((r.metric for r in validator.topk_records if r.step == step), None)
        prefix = self._dp_best_families[attribute]
        metrics = {validator.metric_name: value} if value is not None else None
        path = self.dp_run.store.save(step, state, family=prefix, metrics=metrics)
        if getattr(self, "rank", 0) == 0:
            log.info(
                "Saved best model to %s (%s = %s)", path, validator.metric_name, value
            )
        return path


def check_host_support(host, options, training: Mapping[str, Any]) -> None:
    """Refuse, before anything is built, what ``host`` cannot provide.

    ``training/_dp_ckpt/retention/keep_best`` ranks periodic checkpoints by
    the values a trainer displays: a backend that does not report them
    (its descriptor's ``reports_metrics``), or a run that displays nothing
    (``training.disp_training: false``), would keep no best at all.

    Raises
    ------
    ConfigError
        Naming the option and the backend (or the key that turns it off).
    """
    if not (options.retention or {}).get("keep_best"):
        return
    option = "training/_dp_ckpt/retention/keep_best"
    if not host.reports_metrics:
        raise ConfigError(
            f"`{option}` is not available with dp {host.flag}: its trainer does "
            "not report the displayed metrics a checkpoint is ranked by; remove it "
            "or use a backend that does"
        )
    if training.get("disp_training") is False:
        raise ConfigError(
            f"`{option}` ranks checkpoints by the learning curve displayed at their "
            "step, but training.disp_training is false, so no checkpoint would "
            "record one; remove one of the two"
        )
