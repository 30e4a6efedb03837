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

A policy also answers two questions the protocol declares, with defaults
for a policy that does not care (subclass :class:`RetentionPolicy` to inherit
them; an object with ``keeps`` alone is adapted, :func:`as_policy`):
``keeps_all(count)``, whether a family of ``count`` checkpoints is kept whole
whatever their steps (a window at least that wide, keep-all: the store then
skips planning, so a save costs the same with 10 or 10,000 checkpoints kept),
and, for a policy that is ``ranked``, ``leader(candidates)``: the checkpoint
its family publishes in place of the newest (its best).

Each built-in policy has a ``name`` (stable, for programs) and a ``reason``
(for people, such as ``"newest 5"``); :func:`explain_prune` says, for every
checkpoint, which policies keep it, and removes exactly what
:func:`plan_prune` removes. :func:`policy_from_dict` builds a policy from
plain keys (``keep_last``, ``keep_every_n_steps``, ``keep_best``, ...),
and :func:`policy_to_dict` turns a built-in policy back into them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol, runtime_checkable


class Candidate(tuple):
    """A committed checkpoint as a policy sees it.

    It unpacks as ``(name, step)``, so a policy may treat it as that pair;
    ``metrics`` holds what the trainer reported when it was saved (empty
    when nothing was).
    """

    def __new__(
        cls, name: str, step: int, metrics: Mapping[str, float] | None = None
    ) -> Candidate:
        self = super().__new__(cls, (name, step))
        self.metrics = dict(metrics or {})
        return self

    name = property(itemgetter(0), doc="The file name.")
    step = property(itemgetter(1), doc="The step.")

    def __repr__(self) -> str:
        return f"Candidate({self[0]!r}, {self[1]!r}, {self.metrics!r})"


@runtime_checkable
class RetentionPolicy(Protocol):
    """Decides which committed checkpoints of a family to keep.

    ``keeps`` is the one a policy must say; ``keeps_all``, ``ranked`` and
    ``leader`` have defaults here (subclass this protocol to inherit them).
    """

    #: Whether a family kept by this policy publishes its :meth:`leader` (its
    #: best) in place of the newest checkpoint. ``False`` by default.
    ranked: bool = False

    def keeps(
        self, candidates: Sequence[Candidate], protected: frozenset[str]
    ) -> set[str]:
        """Return the names of ``candidates`` this policy keeps.

        Parameters
        ----------
        candidates : sequence of Candidate
            The family's committed checkpoints, oldest first; each unpacks
            as ``(name, step)``.
        protected : frozenset of str
            Names kept whatever the policy says; a window policy counts them
            towards its window.
        """
        ...

    def keeps_all(self, count: int) -> bool:
        """Whether a family of ``count`` checkpoints is kept whole, whatever their steps.

        ``True`` lets the store skip planning. ``False`` by default.
        """
        return False

    def settles(self, step: int) -> bool:
        """Whether a checkpoint of ``step``, once kept, is kept for good.

        A remote store moves such checkpoints out of HEAD into immutable
        catalogue segments. ``False`` by default (retention may still remove it).
        """
        return False

    def leader(self, candidates: Iterable[Candidate]) -> Candidate | None:
        """The candidate a :attr:`ranked` family publishes in place of the newest.

        ``None`` (the default, or when none qualifies): the newest is
        published.
        """
        return None


def as_policy(policy: object) -> RetentionPolicy:
    """``policy`` itself, or, for an object with ``keeps`` alone, that object adapted.

    The adapted policy keeps what the object keeps and answers the
    protocol's other questions with their defaults; its name, reason and
    keys are the object's.

    Raises
    ------
    TypeError
        When ``policy`` has no ``keeps``.
    """
    if isinstance(policy, RetentionPolicy):
        return policy
    if not callable(getattr(policy, "keeps", None)):
        raise TypeError(
            f"a retention policy has a keeps(candidates, protected) method; "
            f"got {type(policy).__name__}"
        )
    return _KeepsOnly(policy)


@dataclass(frozen=True)
class _KeepsOnly(RetentionPolicy):
    """A policy written with ``keeps`` alone (see :func:`as_policy`)."""

    policy: Any

    @property
    def name(self) -> str:
        return name_of(self.policy)

    @property
    def reason(self) -> str:
        return reason_of(self.policy)

    def keeps(self, candidates, protected):
        return self.policy.keeps(candidates, protected)

    def explain(self, candidates, protected):
        return explain(self.policy, candidates, protected)

    def to_dict(self) -> dict[str, Any] | None:
        return policy_to_dict(self.policy)


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Keep every committed checkpoint."""

    name = "keep_all"
    reason = "all kept"

    def keeps(self, candidates, protected):
        """Every candidate."""
        return {name for name, _ in candidates}

    def keeps_all(self, count: int) -> bool:
        """Always."""
        return True

    def settles(self, step: int) -> bool:
        """Always."""
        return True

    def to_dict(self) -> dict[str, Any]:
        """The keys of :func:`policy_from_dict` that build this policy."""
        return {"keep_last": 0}


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the newest ``count`` committed checkpoints; below one keeps all.

    Protected checkpoints occupy slots of the window: the family holds
    ``max(count, number protected)`` files at most, never ``count + 1``.
    """

    count: int
    name = "keep_last"

    @property
    def window(self) -> int | None:
        """The number of checkpoints kept, or ``None`` for all."""
        return self.count if self.count >= 1 else None

    @property
    def reason(self) -> str:
        """``newest <count>``, or ``all kept`` without a window."""
        return "all kept" if self.window is None else f"newest {self.count}"

    def keeps_all(self, count: int) -> bool:
        """Whether ``count`` checkpoints fit in the window."""
        return self.window is None or count <= self.window

    def settles(self, step: int) -> bool:
        """Without a window, always."""
        return self.window is None

    def keeps(self, candidates, protected):
        """The newest ``count`` minus the protected ones among the candidates."""
        if self.window is None:
            return {name for name, _ in candidates}
        taken = sum(1 for name, _ in candidates if name in protected)
        free = max(0, self.window - taken)
        others = [name for name, _ in candidates if name not in protected]
        return set(others[max(0, len(others) - free) :]) if free else set()

    def to_dict(self) -> dict[str, Any]:
        """The keys of :func:`policy_from_dict` that build this policy."""
        return {"keep_last": self.count}


@dataclass(frozen=True)
class KeepEveryNSteps(RetentionPolicy):
    """Keep milestones: every checkpoint whose step is a multiple of ``n``."""

    n: int
    name = "keep_every_n_steps"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"keep every n steps needs n >= 1, got {self.n}")

    @property
    def reason(self) -> str:
        """``every <n> steps``."""
        return f"every {self.n} steps"

    def keeps(self, candidates, protected):
        """The candidates whose step is a multiple of ``n``."""
        return {name for name, step in candidates if step % self.n == 0}

    def settles(self, step: int) -> bool:
        """A milestone is kept for good."""
        return step % self.n == 0

    def to_dict(self) -> dict[str, Any]:
        """The keys of :func:`policy_from_dict` that build this policy."""
        return {"keep_last": None, "keep_every_n_steps": self.n}


#: Whether a lower (``"min"``) or a higher (``"max"``) metric is better.
BEST_MODES = ("min", "max")


@dataclass(frozen=True)
class KeepBest(RetentionPolicy):
    """Keep the ``count`` checkpoints with the best value of a reported metric.

    The value is read from each checkpoint's commit record (the ``metrics``
    a trainer passes to :meth:`~dp_ckpt_plugin.store.core.CheckpointStore.save`). A
    checkpoint without the metric, or with a value that is not a finite
    number, is never among the best. Ties go to the newer step. Protected
    checkpoints do not take slots: the best ``count`` are kept whatever else
    is.

    Parameters
    ----------
    count : int
        How many to keep, at least one.
    metric : str
        The key of the metric in the commit record, such as ``rmse_val``.
    mode : {"min", "max"}
        Whether a lower or a higher value is better.
    """

    count: int
    metric: str
    mode: str = "min"
    name = "keep_best"
    ranked = True

    def __post_init__(self) -> None:
        if type(self.count) is not int or self.count < 1:
            raise ValueError(f"keep best needs a count >= 1, got {self.count!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"keep best needs a metric name, got {self.metric!r}")
        if self.mode not in BEST_MODES:
            raise ValueError(
                f"keep best mode must be 'min' or 'max', got {self.mode!r}"
            )

    @property
    def reason(self) -> str:
        """``best <count> by <metric> (lowest|highest)``."""
        which = "lowest" if self.mode == "min" else "highest"
        return f"best {self.count} by {self.metric} ({which})"

    def value(self, candidate: Sequence) -> float | None:
        """The candidate's value of the metric, or ``None`` if it has none."""
        value = getattr(candidate, "metrics", {}).get(self.metric)
        if type(value) not in (int, float) or not math.isfinite(value):
            return None
        return float(value)

    def rank(self, candidates: Iterable[Sequence]) -> list:
        """The candidates that carry the metric, best first (ties: newer first)."""
        sign = 1.0 if self.mode == "min" else -1.0
        scored = [(v, c) for c in candidates if (v := self.value(c)) is not None]
        scored.sort(key=lambda vc: (sign * vc[0], -vc[1][1]))
        return [c for _, c in scored]

    def keeps(self, candidates, protected):
        """The best ``count`` candidates carrying the metric."""
        return {c[0] for c in self.rank(candidates)[: self.count]}

    def leader(self, candidates: Iterable[Sequence]) -> Sequence | None:
        """The candidate a family kept by this policy alone publishes: its best.

        A family of best checkpoints is *ranked*: its pointer and alias name
        the best one, not the newest. ``None`` when none carries the metric
        (the newest is published then).
        """
        return next(iter(self.rank(candidates)), None)

    def to_dict(self) -> dict[str, Any]:
        """The keys of :func:`policy_from_dict` that build this policy."""
        return {
            "keep_last": None,
            "keep_best": self.count,
            "best_metric": self.metric,
            "best_mode": self.mode,
        }


@dataclass(frozen=True)
class AnyOf(RetentionPolicy):
    """Keep what any of ``policies`` keeps."""

    policies: tuple[RetentionPolicy, ...]
    name = "any_of"

    def __post_init__(self) -> None:
        object.__setattr__(self, "policies", tuple(map(as_policy, self.policies)))

    @property
    def reason(self) -> str:
        """The reasons of the parts, joined by ``or``."""
        return " or ".join(reason_of(p) for p in self.policies)

    def keeps_all(self, count: int) -> bool:
        """Whether one of the policies keeps a family of ``count`` whole."""
        return any(p.keeps_all(count) for p in self.policies)

    def settles(self, step: int) -> bool:
        """Whether one of the policies keeps ``step`` for good."""
        return any(p.settles(step) for p in self.policies)

    def keeps(self, candidates, protected):
        """The union of what each policy keeps."""
        return set().union(*(p.keeps(candidates, protected) for p in self.policies))

    def explain(self, candidates, protected) -> dict[str, list[tuple[str, str]]]:
        """For each kept name, the ``(name, reason)`` of every part keeping it."""
        found: dict[str, list[tuple[str, str]]] = {}
        for policy in self.policies:
            for kept, why in explain(policy, candidates, protected).items():
                found.setdefault(kept, []).extend(why)
        return found

    def to_dict(self) -> dict[str, Any] | None:
        """The merged keys of the parts, or ``None`` when two parts set one key."""
        merged: dict[str, Any] = {}
        for policy in self.policies:
            part = policy_to_dict(policy)
            if part is None:
                return None
            if part["keep_last"] is None:  # no window: says nothing of one
                del part["keep_last"]
            if set(part) & set(merged):
                return None
            merged.update(part)
        return {"keep_last": None, **merged}


# -- explaining -------------------------------------------------------------------


def name_of(policy: object) -> str:
    """A policy's ``name``, or its class name for a policy without one."""
    return str(getattr(policy, "name", type(policy).__name__))


def reason_of(policy: object) -> str:
    """A policy's ``reason``, or its ``repr`` for a policy without one."""
    return str(getattr(policy, "reason", repr(policy)))


def explain(
    policy: RetentionPolicy, candidates: Sequence[Candidate], protected: frozenset[str]
) -> dict[str, list[tuple[str, str]]]:
    """Which names ``policy`` keeps, each with the ``(name, reason)`` that keeps it.

    A policy with an ``explain`` method (such as :class:`AnyOf`) answers
    itself; any other is asked :meth:`~RetentionPolicy.keeps` and answers
    with its own name and reason.
    """
    method = getattr(policy, "explain", None)
    if method is not None:
        return method(candidates, protected)
    why = [(name_of(policy), reason_of(policy))]
    return {kept: list(why) for kept in policy.keeps(candidates, protected)}


def ranking_of(policy: RetentionPolicy) -> KeepBest | None:
    """The first :class:`KeepBest` in ``policy`` (itself or a part), or ``None``."""
    if isinstance(policy, KeepBest):
        return policy
    found = map(ranking_of, getattr(policy, "policies", ()))
    return next((part for part in found if part is not None), None)


@dataclass(frozen=True)
class Verdict:
    """What retention does with one committed checkpoint, and why.

    Attributes
    ----------
    name : str
        The file name.
    step : int
        Its step.
    kept_by : tuple of (str, str)
        ``(name, reason)`` of everything that keeps it: ``("protected",
        why)`` for a protected checkpoint, ``("above_current_step", why)``
        for one the planner leaves alone, then each policy keeping it.
        Empty when it is removed.
    """

    name: str
    step: int
    kept_by: tuple[tuple[str, str], ...]

    @property
    def kept(self) -> bool:
        """Whether the checkpoint stays."""
        return bool(self.kept_by)


def as_candidates(
    committed: Mapping[str, int] | Iterable[Candidate],
    metrics: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Candidate]:
    """The committed checkpoints as candidates: given as such, or as names to steps.

    The store passes candidates (``Checkpoint.candidate``, the one
    conversion of a checkpoint); a caller with plain data may pass a mapping
    of file names to steps and, in ``metrics``, what each record carries.
    """
    if not isinstance(committed, Mapping):
        return list(committed)
    metrics = metrics or {}
    return [Candidate(n, s, metrics.get(n)) for n, s in committed.items()]


def _split(
    candidates: list[Candidate], current_step: int, keep: frozenset[str]
) -> tuple[list[Candidate], list[Candidate]]:
    """Those numbered above the current step (not protected), and the others, by step."""
    ordered = sorted(candidates, key=lambda c: (c.step, c.name))
    above = [c for c in ordered if c.step > current_step and c.name not in keep]
    rest = [c for c in ordered if c.step <= current_step or c.name in keep]
    return above, rest


def plan_prune(
    committed: Mapping[str, int] | Iterable[Candidate],
    *,
    current_step: int,
    protected: Iterable[str],
    policy: RetentionPolicy,
    metrics: Mapping[str, Mapping[str, float]] | None = None,
) -> list[str]:
    """Return the names of committed checkpoints to remove, oldest first.

    Checkpoints numbered above ``current_step`` are never removed here.

    Parameters
    ----------
    committed : iterable of Candidate, or Mapping[str, int]
        Every committed numbered checkpoint of a family (see
        :func:`as_candidates`).
    current_step : int
        Step of the checkpoint just committed.
    protected : Iterable[str]
        Names never to remove.
    policy : RetentionPolicy
        Which of the others to keep.
    metrics : Mapping[str, Mapping[str, float]], optional
        With a mapping of names to steps: file name to the metrics its
        commit record carries (for :class:`KeepBest`).
    """
    keep = frozenset(protected)
    _, candidates = _split(as_candidates(committed, metrics), current_step, keep)
    kept = keep | policy.keeps(candidates, keep)
    return [c.name for c in candidates if c.name not in kept]


def explain_prune(
    committed: Mapping[str, int] | Iterable[Candidate],
    *,
    current_step: int,
    protected: Mapping[str, str] | Iterable[str],
    policy: RetentionPolicy,
    metrics: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Verdict]:
    """Say, for every committed checkpoint, whether it stays and what keeps it.

    Takes the arguments of :func:`plan_prune` (``protected`` may map each
    name to why it is protected) and removes exactly what it removes: the
    verdicts with an empty ``kept_by`` are :func:`plan_prune`'s names.

    Returns
    -------
    list of Verdict
        Oldest first.
    """
    if not isinstance(protected, Mapping):
        protected = dict.fromkeys(protected, "protected")
    keep = frozenset(protected)
    above, candidates = _split(as_candidates(committed, metrics), current_step, keep)
    kept = explain(policy, candidates, keep)
    why = f"numbered above the current step {current_step}"
    verdicts = [Verdict(c.name, c.step, (("above_current_step", why),)) for c in above]
    for name, step in candidates:
        by = [("protected", protected[name])] if name in keep else []
        verdicts.append(Verdict(name, step, (*by, *kept.get(name, ()))))
    return sorted(verdicts, key=lambda v: (v.step, v.name))


# -- plain keys --------------------------------------------------------------------

#: The keys :func:`policy_from_dict` reads, with what each means.
POLICY_KEYS = {
    "keep_last": "keep the newest N (below one: keep all; null: no window)",
    "keep_every_n_steps": "also keep every checkpoint whose step is a multiple of N",
    "keep_best": "also keep the N with the best value of best_metric",
    "best_metric": "the metric keep_best ranks by, as the commit records name it",
    "best_mode": "'min' (lower is better, the default) or 'max'",
}


def _int_or_none(spec: Mapping[str, Any], key: str) -> int | None:
    value = spec.get(key)
    if value is not None and type(value) is not int:
        raise ValueError(f"retention key {key!r} must be an integer, got {value!r}")
    return value


def policy_from_dict(spec: Mapping[str, Any]) -> RetentionPolicy:
    """Build a policy from plain keys, such as a configuration file gives.

    ``{"keep_last": 5, "keep_every_n_steps": 1000, "keep_best": 3,
    "best_metric": "rmse_val"}`` keeps the newest 5, every thousandth step
    and the 3 with the lowest ``rmse_val``: ``AnyOf((KeepLast(5),
    KeepEveryNSteps(1000), KeepBest(3, "rmse_val")))``.

    Parameters
    ----------
    spec : Mapping
        The keys of :data:`POLICY_KEYS`. ``keep_last`` defaults to 5;
        ``null`` means no window (then another key must keep something).
        ``keep_every_n_steps`` and ``keep_best`` are off when absent,
        ``null`` or 0.

    Returns
    -------
    RetentionPolicy
        One policy, or an :class:`AnyOf` of several (window, milestones,
        best, in that order).

    Raises
    ------
    ValueError
        Naming the key: an unknown key, a value of the wrong type, or
        ``keep_best`` without ``best_metric``.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"a retention policy is a mapping of keys, got {spec!r}")
    if "max_ckpt_keep" in spec:  # the key of 0.2
        raise ValueError("retention key 'max_ckpt_keep' is 'keep_last' since 0.3")
    unknown = sorted(set(spec) - set(POLICY_KEYS))
    if unknown:
        raise ValueError(
            f"unknown retention key {unknown[0]!r}; known keys: "
            + ", ".join(POLICY_KEYS)
        )
    parts: list[RetentionPolicy] = []
    window = _int_or_none(spec, "keep_last") if "keep_last" in spec else 5
    if window is not None:
        parts.append(KeepLast(window))
    every = _int_or_none(spec, "keep_every_n_steps")
    if every:
        parts.append(KeepEveryNSteps(every))
    best = _int_or_none(spec, "keep_best")
    if best:
        metric = spec.get("best_metric")
        if not metric:
            raise ValueError("retention key 'keep_best' needs 'best_metric'")
        parts.append(KeepBest(best, metric, spec.get("best_mode") or "min"))
    if not parts:
        raise ValueError(
            "a retention policy with keep_last null needs keep_every_n_steps "
            "or keep_best, or it would keep nothing"
        )
    return parts[0] if len(parts) == 1 else AnyOf(tuple(parts))


def policy_to_dict(policy: RetentionPolicy) -> dict[str, Any] | None:
    """The keys of :func:`policy_from_dict` that build ``policy``.

    ``None`` for a policy those keys cannot express (one without a
    ``to_dict`` method, or an :class:`AnyOf` setting one key twice).
    """
    method = getattr(policy, "to_dict", None)
    return method() if method is not None else None
