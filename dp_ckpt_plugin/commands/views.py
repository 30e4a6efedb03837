"""What the ``dp-ckpt`` commands see of a store: :class:`StoreView`.

``ls``, ``verify``, ``resolve``/``show``, ``inspect`` and ``prune`` are
written once over this view. It has two implementations: a store directory
(``directory_view``) and a store on object storage read through its HEAD
(``head_view``); ``open_store.open_view`` and ``open_store.locate`` pick
one from a command-line value. Every field of these values that came from object
storage is shown through ``text.shown`` by the commands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..checkpoint import Checkpoint
from ..checkpoint.layout import Family
from ..checkpoint.records import CommitRecord
from ..remote.head import Entry, Head
from ..remote.lease import LeaseState
from ..retention import Candidate, KeepBest, RetentionPolicy, Verdict, explain_prune


@dataclass(frozen=True)
class Listed:
    """One committed checkpoint, as its store lists it.

    ``where`` is its path or its URL. What the listing read of it: a
    directory's commit ``record`` (with ``on_disk``, the size found beside
    it, and ``torn``, whether that is not the record's), or HEAD's ``entry``.
    """

    name: str
    step: int
    family: str | None
    size: int
    where: str
    digest: str | None = None
    metrics: Mapping[str, float | None] | None = None
    created: float | None = None
    format: str | None = None
    record: CommitRecord | None = field(default=None, repr=False, compare=False)
    entry: Entry | None = field(default=None, repr=False, compare=False)
    on_disk: int | None = None
    torn: bool = False


@dataclass
class Shelf:
    """One family of a store: its checkpoints oldest first, and what names them.

    ``pointer`` is where its pointer lives (a directory's file name), ``latest``
    and ``alias`` the names they lead to; ``policy`` is the retention policy
    the store records (``None``: unknown), ``reason`` it for people.
    """

    prefix: str
    items: list[Listed] = field(default_factory=list)
    suffix: str | None = None
    pointer: str | None = None
    latest: str | None = None
    alias: str | None = None
    policy: RetentionPolicy | None = None
    reason: str | None = None

    def family(self) -> Family:
        """Its names (a directory's family: ``suffix`` and ``pointer`` known)."""
        return Family(self.prefix, self.suffix, self.pointer)

    def checkpoints(self) -> list[Checkpoint]:
        """Its checkpoints as the core sees them (a directory's: paths)."""
        return [
            Checkpoint(Path(c.where), c.step, self.prefix, c.record) for c in self.items
        ]

    def protections(self) -> dict[str, str]:
        """The names retention never removes, each with why."""
        found: dict[str, list[str]] = {}
        for kind, name in (("pointer", self.latest), ("alias", self.alias)):
            if name:
                found.setdefault(name, []).append(kind)
        what = "best" if isinstance(self.policy, KeepBest) else "latest"
        return {name: f"{what} ({', '.join(how)})" for name, how in found.items()}

    def explain(self, policy: RetentionPolicy) -> list[Verdict]:
        """What ``policy`` keeps now, and why: the pointer and alias targets and
        the newest checkpoint are protected."""
        protected = self.protections()
        if self.items:
            protected.setdefault(self.items[-1].name, "newest")
        return explain_prune(
            [Candidate(c.name, c.step, c.metrics) for c in self.items],
            current_step=max((c.step for c in self.items), default=0),
            protected=protected,
            policy=policy,
        )


@dataclass(frozen=True)
class Aside:
    """Something of a store that is not a committed checkpoint: a numbered file
    without a (sound) record, a quarantined file, an archive of an earlier run."""

    name: str
    where: str
    family: str | None = None
    step: int | None = None
    problem: str = ""
    size: int | None = None
    created: float | None = None
    checkpoints: tuple[str, ...] = ()


@dataclass
class Listing:
    """What a store holds, family by family (the primary family first).

    ``head`` and ``lease`` are a store on object storage's HEAD and LEASE
    (``None`` for a directory); ``vanished``, the files of a directory listed
    but gone when their record was read (a live store's retention).
    """

    where: str
    families: list[Shelf]
    format: str | None = None
    manifest: bool = False
    strays: list[Aside] = field(default_factory=list)
    quarantined: list[Aside] = field(default_factory=list)
    archives: list[Aside] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vanished: list[Path] = field(default_factory=list)
    head: Head | None = None
    lease: LeaseState | None = None

    def items(self) -> list[Listed]:
        """Every committed checkpoint, family by family."""
        return [c for f in self.families for c in f.items]

    def checkpoints(self) -> list[Checkpoint]:
        """Every committed checkpoint of a directory, as the core sees it."""
        return [c for f in self.families for c in f.checkpoints()]


@dataclass(frozen=True)
class Check:
    """What ``verify`` found of one checkpoint: sound, a problem, or gone
    (removed by retention meanwhile); ``hashed`` bytes were read."""

    item: Listed
    problem: str = ""
    gone: bool = False
    hashed: int = 0

    @property
    def ok(self) -> bool:
        """Whether it matches its record (or went away cleanly)."""
        return not self.problem


@dataclass(frozen=True)
class Resolution:
    """The checkpoint a restart specification names, and how it was found."""

    item: Listed
    how: str
    checked: str
    record: CommitRecord | None
    warnings: tuple[str, ...] = ()
    fell_back: bool = False
    input: dict[str, Any] | None = None


#: What ``prune`` hands a view: the checkpoints of a listing to remove.
Decide = Callable[[Listing], list[Listed]]


@runtime_checkable
class StoreView(Protocol):
    """A store as the commands read and tidy it."""

    where: str

    def listing(self, prefix: str | None = None) -> Listing:
        """What the store holds (only family ``prefix`` when given).

        Raises UsageError naming the families there are when it has no ``prefix``.
        """

    def pointer_problems(self, listing: Listing) -> list[str]:
        """Pointers and aliases of ``listing`` that name no checkpoint."""

    def check(self, item: Listed, *, digest: bool) -> Check:
        """``item`` against its record: its size, and with ``digest`` its content."""

    def resolve(self, spec: str, *, digest: bool) -> Resolution:
        """What ``--restart spec`` would use, moving nothing."""

    def fetch(self, spec: str) -> tuple[Path, str | None, list[str]]:
        """A local file of the checkpoint ``spec`` names (fetched and verified
        where it is remote), its URL (``None`` for a file) and the warnings."""

    def prune(
        self, prefix: str | None, decide: Decide, *, dry_run: bool
    ) -> tuple[Listing, list[Listed]]:
        """Remove what ``decide`` picks of a fresh listing: a directory's read
        under its lock, HEAD's swapped under the writer lease (neither taken
        with ``dry_run``: nothing is removed)."""


@runtime_checkable
class Leased(Protocol):
    """A store with a writer lease (on object storage)."""

    def release_lease(self) -> str | None:
        """Release a lease whose holder is gone; why, or ``None`` when none."""


def select(families: list[Shelf], prefix: str | None, where: str) -> list[Shelf]:
    """The families asked for (all by default).

    Raises
    ------
    UsageError
        Naming the families the store has, when it has no ``prefix``.
    """
    from . import UsageError

    if prefix is None:
        return families
    found = [f for f in families if f.prefix == prefix]
    if not found:
        known = ", ".join(f.prefix for f in families) or "none"
        raise UsageError(f"{where} has no family {prefix!r} (families: {known})")
    return found
