"""What a store directory holds: its numbered files and which are committed.

A numbered file of a family counts as committed when its commit record is well
formed and agrees with the file: the record's name, step and family are those
of the file it sits beside. Order always comes from steps, never timestamps.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .checkpoint import Checkpoint
from .errors import InvalidRecordError
from .layout import Family, record_name, record_target
from .records import CommitRecord, parse_record, read_record


def numbered_files(directory: Path, family: Family) -> list[Path]:
    """Return the numbered checkpoint files of ``family`` in ``directory``."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        Path(e.path)
        for e in entries
        if family.step_of(e.name) is not None and e.is_file(follow_symlinks=False)
    ]


def read_record_or_none(path: Path) -> CommitRecord | None:
    """Return a checkpoint's commit record; malformed counts as none."""
    try:
        return read_record(path)
    except InvalidRecordError:
        return None


def committed(
    directory: Path, family: Family, *, newest_first: bool = False
) -> list[Checkpoint]:
    """Return every committed checkpoint of ``family`` in ``directory``, by step.

    One directory listing; a record is read only for a numbered file that has
    one beside it (thousands of checkpoints open in about a second).
    """
    try:
        entries = {e.name: e for e in os.scandir(directory)}
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    folder = os.fspath(directory)
    for name, entry in entries.items():
        step = family.step_of(name)
        rec = record_name(name)
        if step is None or rec not in entries:
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        source = os.path.join(folder, rec)
        try:
            with open(source, encoding="utf-8") as handle:
                record = parse_record(handle.read(), source=source, name=name)
        except (OSError, UnicodeDecodeError, InvalidRecordError):
            continue
        if record.step == step and record.family == family.prefix:
            found.append(Checkpoint(Path(entry.path), step, family.prefix, record))
    return sorted(found, key=lambda c: c.step, reverse=newest_first)


def uncommitted(directory: Path, family: Family) -> list[Path]:
    """Return the numbered files of ``family`` that have no usable record."""
    return [
        p for p in numbered_files(directory, family) if read_record_or_none(p) is None
    ]


def recorded_families(directory: Path, suffix: str) -> set[str]:
    """Return the prefixes named by the commit records in ``directory``."""
    families = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            target = record_target(name)
            if target is None or not target.endswith(suffix):
                continue
            record = read_record_or_none(directory / target)
            if record is not None:
                families.add(record.family)
    return families


class Catalogue:
    """The committed checkpoints of a store's families, kept in memory.

    Read from disk once, on first use, and kept up to date by the store on
    every save, prune and archive, so that planning retention costs the same
    with 10 or 10,000 checkpoints kept: no record is read again.
    """

    def __init__(self, directory: Path, families: list[Family]) -> None:
        self.directory = directory
        self.families = families
        self._by_family: dict[str, dict[str, Checkpoint]] | None = None

    def of(self, family: Family) -> dict[str, Checkpoint]:
        """The committed checkpoints of ``family`` by file name."""
        if self._by_family is None:
            self._by_family = {
                f.prefix: {c.name: c for c in committed(self.directory, f)}
                for f in self.families
            }
        return self._by_family[family.prefix]

    def add(self, family: Family, checkpoint: Checkpoint) -> None:
        """Note a checkpoint just committed."""
        self.of(family)[checkpoint.name] = checkpoint

    def discard(self, family: Family, name: str) -> None:
        """Forget a checkpoint removed or moved away."""
        self.of(family).pop(name, None)

    def newest(self, family: Family) -> Checkpoint | None:
        """The committed checkpoint of the highest step, or ``None``."""
        return max(self.of(family).values(), key=lambda c: c.step, default=None)

    def invalidate(self) -> None:
        """Read the directory again on next use (something moved files aside)."""
        self._by_family = None
