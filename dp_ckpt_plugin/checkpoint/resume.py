"""What a run starts from, as far as its store's retention and archive care.

A run that restarts from (or is initialized from) a checkpoint of its own
store directory must not lose that checkpoint to retention before it has
committed a newer one (rule 12), and a run that *continues* from one keeps
the store's checkpoints up to that step in place while archiving those above
it (rule 14). :class:`ResumeState` holds those two facts, and the lineage
the run's next checkpoint of each family continues
(``lineage.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .layout import Family
from .lineage import Lineage, Link, chain_of
from .records import CommitRecord


class ResumeState:
    """The checkpoint a run starts from, and what it protects.

    Attributes
    ----------
    start : Path or None
        The checkpoint inside the store the run starts from.
    continues : bool
        Whether the run goes on from that checkpoint's step (a restart), as
        opposed to starting its own count (an initialization).
    origin : Path or None
        The checkpoint the run starts from, wherever it is (an archive of the
        store, another directory).
    """

    def __init__(self) -> None:
        self.origin: Path | None = None
        self.start: Path | None = None
        self.continues = False
        self._protected: dict[str, Path] = {}
        self._chains: dict[str, tuple[Link, ...]] = {}
        self._record: CommitRecord | None = None

    def start_from(self, path, place, families, continues: bool, record=None) -> None:
        """The run starts from ``path`` (its commit record ``record``, as resolved).

        Only a checkpoint of the store's directory (``place``: a
        :class:`~dp_ckpt_plugin.store.place.StorePlace`) is noted.
        """
        path = self.origin = Path(path)
        directory, storage = place.directory, place.storage
        if storage.real(path.parent) == storage.real(directory):
            self.start, self.continues = directory / path.name, continues
            self._record = record
            self._protected.clear()
            self.apply(families)

    def apply(self, families: Iterable[Family]) -> None:
        """Protect the start in whichever of ``families`` it belongs to."""
        if self.start is None:
            return
        for family in families:
            if family.step_of(self.start.name) is not None:
                self._protected[family.prefix] = self.start

    @property
    def continues_from(self) -> Path | None:
        """The checkpoint the run continues from, if it does."""
        return self.start if self.continues else None

    def protected(self, family: Family) -> Path | None:
        """The checkpoint of ``family`` retention must keep, if any."""
        return self._protected.get(family.prefix)

    def committed(self, family: Family, step: int) -> None:
        """A checkpoint of ``step`` was committed: protection ends at or past the start."""
        start = self._protected.get(family.prefix)
        if start is not None and step >= (family.step_of(start.name) or 0):
            del self._protected[family.prefix]

    def paths(self) -> set[Path]:
        """Where what the run starts from is (its start, followed into an archive)."""
        found = (self.origin, self.start, *self._protected.values())
        return {p for p in found if p is not None}

    def moved(self, names: Iterable[str], dest: Path) -> None:
        """Checkpoints went into the archive ``dest``: follow the start there."""
        names = set(names)
        for prefix, path in list(self._protected.items()):
            if path.name in names:
                self._protected[prefix] = dest / path.name

    def lineage(self, family: Family, epoch: int | None) -> Lineage | None:
        """What the run's next checkpoint of ``family`` continues from.

        Its previous checkpoint of the family, else the checkpoint the run
        continues from (its record as resolved, not read again), else nothing.
        ``None`` for a run of no remote store (``epoch`` ``None``).
        """
        if epoch is None:
            return None
        chain = self._chains.get(family.prefix)
        if chain is None:
            record = self._record if self.continues_from is not None else None
            chain = () if record is None else chain_of_record(record)
        return Lineage(epoch, chain)

    def made(self, family: Family, record: CommitRecord) -> CommitRecord:
        """The run committed ``record`` in ``family``: its next one continues it."""
        self._chains[family.prefix] = chain_of_record(record)
        return record


def chain_of_record(record: CommitRecord) -> tuple[Link, ...]:
    """The chain of a committed checkpoint (one exact link when it has no lineage)."""
    if record.lineage is None:
        return (Link(0, record.step, record.digest),)
    return chain_of(record.lineage, record.step, record.digest)
