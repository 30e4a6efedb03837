"""Retention policies: which committed checkpoints of a family to keep.

A policy is a small object that says how many committed numbered checkpoints a
family may hold. :func:`plan_prune` applies it together with the rules that do
not depend on the policy: checkpoints numbered above the current step are
remnants of an earlier, longer run; protected checkpoints (the one just
written, the published one, the one the run resumed from) are never removed
and occupy slots of the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class KeepAll:
    """Keep every committed checkpoint."""

    @property
    def window(self) -> int | None:
        """No window: nothing is removed for count."""
        return None


@dataclass(frozen=True)
class KeepLast:
    """Keep the newest ``count`` committed checkpoints; below one keeps all."""

    count: int

    @property
    def window(self) -> int | None:
        """The number of checkpoints kept, or ``None`` for all."""
        return self.count if self.count >= 1 else None


RetentionPolicy = KeepAll | KeepLast


def keep_count_from_ratio(ratio: float, num_steps: int, save_freq: int) -> int:
    """Turn ``ckpt_keep_ratio`` into a count, as deepmd-kit 3.2.0 does.

    A run writes ``ceil(num_steps / save_freq)`` checkpoints (the final one is
    off-cadence when ``num_steps`` is not a multiple); the newest
    ``ceil(ratio * total)`` of them, at least one, are kept.
    """
    total = max(1, ceil(num_steps / save_freq)) if save_freq > 0 else 1
    return max(1, ceil(ratio * total))


def policy_from_training(
    training: Mapping[str, object],
    *,
    num_steps: int | None = None,
    ema: bool = False,
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
        steps = int(
            num_steps if num_steps is not None else training.get("numb_steps", 0) or 0
        )
        return KeepLast(
            keep_count_from_ratio(
                float(ratio), steps, int(training.get("save_freq", 1000))
            )
        )
    count = int(training.get("max_ckpt_keep", 5))
    if ema and training.get("ema_ckpt_keep") is not None:
        count = int(training["ema_ckpt_keep"])
    return KeepLast(count)


def plan_prune(
    committed: Mapping[str, int],
    *,
    current_step: int,
    protected: Iterable[str],
    policy: RetentionPolicy,
) -> list[str]:
    """Return the names of committed checkpoints to remove, oldest first.

    Parameters
    ----------
    committed : Mapping[str, int]
        File name to step of every committed numbered checkpoint of a family.
    current_step : int
        Step of the checkpoint just committed.
    protected : Iterable[str]
        Names never to remove. They count towards the window, so the family
        keeps ``max(window, number protected)`` files at most.
    policy : RetentionPolicy
        How many to keep.
    """
    keep = set(protected)
    remnants = [n for n, s in committed.items() if s > current_step and n not in keep]
    rest = sorted((s, n) for n, s in committed.items() if n not in remnants)
    doomed = sorted(remnants, key=lambda n: committed[n])
    window = policy.window
    if window is None:
        return doomed
    limit = max(window, sum(1 for _, n in rest if n in keep))
    excess = len(rest) - limit
    for _, name in rest:
        if excess <= 0:
            break
        if name not in keep:
            doomed.append(name)
            excess -= 1
    return doomed
