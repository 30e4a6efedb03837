"""deepmd-kit's retention keys as a retention policy.

``training.max_ckpt_keep`` (default 5), ``ckpt_keep_ratio`` and
``ema_ckpt_keep`` become :mod:`dp_ckpt_plugin.retention` policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import ceil

from ..retention import KeepLast, RetentionPolicy


def keep_count_from_ratio(ratio: float, num_steps: int, save_freq: int) -> int:
    """Turn ``ckpt_keep_ratio`` into a count, as deepmd-kit 3.2.0 does.

    A run writes ``ceil(num_steps / save_freq)`` checkpoints (the final one is
    off-cadence when ``num_steps`` is not a multiple); the newest
    ``ceil(ratio * total)`` of them, at least one, are kept.
    """
    total = max(1, ceil(num_steps / save_freq)) if save_freq > 0 else 1
    return max(1, ceil(ratio * total))


def policy_from_training(
    training: Mapping[str, object], *, num_steps: int | None = None, ema: bool = False
) -> RetentionPolicy:
    """Build the policy deepmd-kit's ``training`` keys describe.

    Parameters
    ----------
    training : Mapping
        The ``training`` section: ``max_ckpt_keep`` (default 5),
        ``ckpt_keep_ratio``, ``ema_ckpt_keep``, ``save_freq``, ``numb_steps``.
    num_steps : int, optional
        The resolved run length; defaults to ``training["numb_steps"]``.
    ema : bool, optional
        Whether the policy is for the EMA family (``ema_ckpt_keep``, else the
        periodic family's count).
    """
    ratio = training.get("ckpt_keep_ratio")
    if ratio is not None:
        if num_steps is None:
            num_steps = training.get("numb_steps", 0) or 0
        save_freq = int(training.get("save_freq", 1000))
        return KeepLast(keep_count_from_ratio(float(ratio), int(num_steps), save_freq))
    count = int(training.get("max_ckpt_keep", 5))
    if ema and training.get("ema_ckpt_keep") is not None:
        count = int(training["ema_ckpt_keep"])
    return KeepLast(count)
