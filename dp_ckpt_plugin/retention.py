"""Retention: which committed checkpoints of a family to keep.

A policy is a small object with one method, :meth:`RetentionPolicy.keeps`,
that names the checkpoints it wants kept (orbax's preservation policies are
the model). Policies compose with :class:`AnyOf`: a checkpoint stays if any
policy keeps it. :func:`plan_prune` applies a policy together with the rules
no policy can change: protected checkpoints (the one just written, the
published one, the one the run resumed from) are never removed, and
checkpoints numbered above the current step are not the window's: they are
left alone (an earlier run's are archived before a run's first save, rule
14). A new policy needs no edit of the planner.

A policy may also say, with ``keeps_all(count)``, that a family of ``count``
checkpoints is kept whole whatever their steps (a window at least that wide,
keep-all): the store then skips planning, so a save costs the same with 10 or
10,000 checkpoints kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

#: A committed checkpoint as a policy sees it: its file name and its step.
Candidate = tuple[str, int]


@runtime_checkable
class RetentionPolicy(Protocol):
    """Decides which committed checkpoints of a family to keep."""

    def keeps(
        self, candidates: Sequence[Candidate], protected: frozenset[str]
    ) -> set[str]:
        """Return the names of ``candidates`` this policy keeps.

        Parameters
        ----------
        candidates : sequence of (name, step)
            The family's committed checkpoints, oldest first.
        protected : frozenset of str
            Names kept whatever the policy says; a window policy counts them
            towards its window.
        """
        ...


@dataclass(frozen=True)
class KeepAll:
    """Keep every committed checkpoint."""

    def keeps(self, candidates, protected):
        """Every candidate."""
        return {name for name, _ in candidates}

    def keeps_all(self, count: int) -> bool:
        """Always."""
        return True


@dataclass(frozen=True)
class KeepLast:
    """Keep the newest ``count`` committed checkpoints; below one keeps all.

    Protected checkpoints occupy slots of the window: the family holds
    ``max(count, number protected)`` files at most, never ``count + 1``.
    """

    count: int

    @property
    def window(self) -> int | None:
        """The number of checkpoints kept, or ``None`` for all."""
        return self.count if self.count >= 1 else None

    def keeps_all(self, count: int) -> bool:
        """Whether ``count`` checkpoints fit in the window."""
        return self.window is None or count <= self.window

    def keeps(self, candidates, protected):
        """The newest ``count`` minus the protected ones among the candidates."""
        if self.window is None:
            return {name for name, _ in candidates}
        taken = sum(1 for name, _ in candidates if name in protected)
        free = max(0, self.window - taken)
        others = [name for name, _ in candidates if name not in protected]
        return set(others[max(0, len(others) - free) :]) if free else set()


@dataclass(frozen=True)
class KeepEveryNSteps:
    """Keep milestones: every checkpoint whose step is a multiple of ``n``."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"keep every n steps needs n >= 1, got {self.n}")

    def keeps(self, candidates, protected):
        """The candidates whose step is a multiple of ``n``."""
        return {name for name, step in candidates if step % self.n == 0}


@dataclass(frozen=True)
class AnyOf:
    """Keep what any of ``policies`` keeps."""

    policies: tuple[RetentionPolicy, ...]

    def keeps_all(self, count: int) -> bool:
        """Whether one of the policies keeps a family of ``count`` whole."""
        return any(
            getattr(p, "keeps_all", lambda n: False)(count) for p in self.policies
        )

    def keeps(self, candidates, protected):
        """The union of what each policy keeps."""
        kept: set[str] = set()
        for policy in self.policies:
            kept |= policy.keeps(candidates, protected)
        return kept


def plan_prune(
    committed: Mapping[str, int],
    *,
    current_step: int,
    protected: Iterable[str],
    policy: RetentionPolicy,
) -> list[str]:
    """Return the names of committed checkpoints to remove, oldest first.

    Checkpoints numbered above ``current_step`` are never removed here.

    Parameters
    ----------
    committed : Mapping[str, int]
        File name to step of every committed numbered checkpoint of a family.
    current_step : int
        Step of the checkpoint just committed.
    protected : Iterable[str]
        Names never to remove.
    policy : RetentionPolicy
        Which of the others to keep.
    """
    keep = frozenset(protected)
    rest = sorted(
        (s, n) for n, s in committed.items() if s <= current_step or n in keep
    )
    candidates = [(n, s) for s, n in rest]
    kept = keep | policy.keeps(candidates, keep)
    return [n for n, _ in candidates if n not in kept]
