"""The ``retention`` options of the plugin's section, and the policies they give.

deepmd-kit's own keys set the window (``training.max_ckpt_keep``,
``ckpt_keep_ratio``, ``ema_ckpt_keep``: :mod:`dp_ckpt_plugin.deepmd.policy`); these keep more::

    "training": {
      "max_ckpt_keep": 5,
      "_dp_ckpt": {
        "retention": {"keep_every_n_steps": 1000, "keep_best": 3, "best_metric": "rmse_val"}
      }
    }

keeps, beside the newest ``max_ckpt_keep``, every checkpoint of a step that
is a multiple of 1000 and the 3 with the lowest ``rmse_val`` (the metrics
deepmd-kit displays in ``lcurve.out``, recorded with each checkpoint saved at a
display step). :func:`retention_args` is the schema the host's section
includes; :func:`periodic_policy` and :func:`best_policy` build the core's
policies (:func:`dp_ckpt_plugin.retention.policy_from_dict`). Importing this
module imports neither torch nor deepmd-kit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dargs import Argument

from ..retention import BEST_MODES, KeepBest, RetentionPolicy, policy_from_dict
from .policy import policy_from_training

#: Key of the sub-section inside the plugin's own section.
SECTION = "retention"

DOC_RETENTION = (
    "Retention beyond DeePMD-kit's window. DeePMD-kit's ``training.max_ckpt_keep`` "
    "(or ``ckpt_keep_ratio``, and ``ema_ckpt_keep`` for the EMA checkpoints) "
    "keeps the newest checkpoints; these options keep more, never fewer. A "
    "checkpoint stays when any rule keeps it. ``dp-ckpt ls <save_dir>`` says "
    "which rule keeps each file."
)
DOC_KEEP_EVERY = (
    "Also keep every checkpoint whose step is a multiple of this number "
    "(milestones), in both the periodic and the EMA family. Must be a "
    "multiple of ``training.save_freq`` to keep anything. ``null`` or 0: off."
)
DOC_KEEP_BEST = (
    "Also keep this many periodic checkpoints with the best value of "
    "``best_metric``. Each checkpoint saved at a step where DeePMD-kit displays "
    "its learning curve records the values it displays (the ``lcurve.out`` "
    "columns, such as ``rmse_val``, ``rmse_e_trn``); a checkpoint saved at "
    "another step records none and is never among the best, so let "
    "``training.disp_freq`` divide ``training.save_freq``. ``null`` or 0: off. "
    "Best-validation checkpoints (``validating.full_validation``) are kept "
    "apart, by ``validating.max_best_ckpt``."
)
DOC_BEST_METRIC = (
    "The ``lcurve.out`` column ``keep_best`` ranks by: ``rmse_val`` (the "
    "default), ``rmse_trn``, ``rmse_e_val``, ``rmse_f_val``, ... as DeePMD-kit "
    "names them for the loss in use (multi-task: ``rmse_val_<task>``)."
)
DOC_BEST_MODE = "``min`` (the default: a lower value is better) or ``max``."


def count_arg(name: str, doc: str) -> Argument:
    """Return an optional count (0 or more) or ``null``."""
    return Argument(
        name,
        [int, None],
        optional=True,
        default=None,
        doc=doc,
        extra_check=lambda value: value is None or value >= 0,
        extra_check_errmsg="It must be a count (0 or more) or null.",
    )


def retention_args() -> Argument:
    """Return the schema of ``training/_dp_ckpt/retention``.

    Returns
    -------
    dargs.Argument
        An optional dict whose options all have defaults.
    """

    return Argument(
        SECTION,
        dict,
        [
            count_arg("keep_every_n_steps", DOC_KEEP_EVERY),
            count_arg("keep_best", DOC_KEEP_BEST),
            Argument(
                "best_metric",
                str,
                optional=True,
                default="rmse_val",
                doc=DOC_BEST_METRIC,
            ),
            Argument(
                "best_mode",
                str,
                optional=True,
                default="min",
                doc=DOC_BEST_MODE,
                extra_check=lambda value: value in BEST_MODES,
                extra_check_errmsg="It must be 'min' or 'max'.",
            ),
        ],
        optional=True,
        default={},
        doc=DOC_RETENTION,
    )


def periodic_policy(
    training: Mapping[str, Any],
    retention: Mapping[str, Any] | None,
    *,
    num_steps: int | None = None,
    ema: bool = False,
) -> RetentionPolicy:
    """The policy of the periodic (or, with ``ema``, the EMA) family.

    DeePMD-kit's window (:func:`~dp_ckpt_plugin.deepmd.policy.policy_from_training`), the
    milestones (``keep_every_n_steps``) and, for the periodic family, the best
    by a displayed metric (``keep_best``; EMA checkpoints record no metric of
    their own).

    Parameters
    ----------
    training : Mapping
        The ``training`` section.
    retention : Mapping or None
        The validated ``training/_dp_ckpt/retention`` section.
    num_steps : int, optional
        The resolved run length (for ``ckpt_keep_ratio``).
    ema : bool, optional
        Whether the policy is the EMA family's.
    """
    window = policy_from_training(training, num_steps=num_steps, ema=ema)
    retention = retention or {}
    spec: dict[str, Any] = {
        "keep_last": window.count,
        "keep_every_n_steps": retention.get("keep_every_n_steps"),
    }
    if not ema:
        spec["keep_best"] = retention.get("keep_best")
        spec["best_metric"] = retention.get("best_metric", "rmse_val")
        spec["best_mode"] = retention.get("best_mode", "min")
    return policy_from_dict(spec)


def best_policy(count: int, metric: str) -> KeepBest:
    """The policy of a family of best-validation checkpoints.

    ``validating.max_best_ckpt`` of them, lowest ``validating.validation_metric``
    first, as deepmd-kit ranks them.
    """
    return KeepBest(int(count), metric, "min")


def display_metrics(
    train: Mapping[str, Any], valid: Mapping[str, Any] | None
) -> dict[str, float]:
    """The values of one learning-curve row, by their ``lcurve.out`` column names.

    Single task: ``<key>_trn`` and ``<key>_val``; multi-task (results keyed by
    task): ``<key>_trn_<task>`` and ``<key>_val_<task>``.
    """

    def columns(results: Mapping[str, Any] | None, kind: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in (results or {}).items():
            if isinstance(value, Mapping):  # a task's results
                found.update(
                    {f"{k}_{kind}_{key}": v for k, v in value.items() if v is not None}
                )
            elif value is not None:
                found[f"{key}_{kind}"] = value
        return found

    return {**columns(train, "trn"), **columns(valid, "val")}
