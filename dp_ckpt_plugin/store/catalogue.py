"""The committed checkpoints of a store's families, kept in memory."""

from __future__ import annotations

from ..checkpoint import Checkpoint
from ..checkpoint.catalogue import committed
from ..checkpoint.layout import Family
from .place import StorePlace


class Catalogue:
    """The committed checkpoints of a store's families, kept in memory.

    Read from disk once, on first use, and kept up to date by the store on
    every save, prune and archive, so that planning retention costs the same
    with 10 or 10,000 checkpoints kept: no record is read again.
    """

    def __init__(self, place: StorePlace, families: list[Family]) -> None:
        self.place = place
        self.families = families
        self._by_family: dict[str, dict[str, Checkpoint]] | None = None

    def of(self, family: Family) -> dict[str, Checkpoint]:
        """The committed checkpoints of ``family`` by file name."""
        if self._by_family is None:
            where, storage = self.place.directory, self.place.storage
            self._by_family = {
                f.prefix: {c.name: c for c in committed(where, f, storage=storage)}
                for f in self.families
            }
        return self._by_family[family.prefix]

    def add(self, family: Family, checkpoint: Checkpoint) -> None:
        """Note a checkpoint just committed."""
        self.of(family)[checkpoint.name] = checkpoint

    def discard(self, family: Family, name: str) -> None:
        """Forget a checkpoint removed or moved away."""
        self.of(family).pop(name, None)

    def candidates(self, family: Family, up_to: int | None = None) -> list:
        """The committed checkpoints as retention sees them, oldest first."""
        return [
            c.candidate()
            for c in sorted(self.of(family).values(), key=lambda c: c.step)
            if up_to is None or c.step <= up_to
        ]

    def newest(self, family: Family) -> Checkpoint | None:
        """The committed checkpoint of the highest step, or ``None``."""
        return max(self.of(family).values(), key=lambda c: c.step, default=None)

    def invalidate(self) -> None:
        """Read the directory again on next use (something moved files aside)."""
        self._by_family = None
