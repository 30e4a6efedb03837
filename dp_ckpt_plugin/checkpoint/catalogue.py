"""What a store directory holds: its numbered files and which are committed.

A numbered file of a family counts as committed when its commit record is well
formed and agrees with the file: the record's name, step and family are those
of the file it sits beside, and both are regular files. Order always comes
from steps, never timestamps. Everything is read through a
:class:`~dp_ckpt_plugin.storage.Storage`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidRecordError
from ..storage import Storage, default_storage, entries_of
from . import Checkpoint
from .layout import Family, record_name, record_target
from .records import CommitRecord, read_record


def read_record_or_none(
    path: Path, *, storage: Storage | None = None
) -> CommitRecord | None:
    """Return a checkpoint's commit record; malformed counts as none."""
    try:
        return read_record(path, storage=storage)
    except InvalidRecordError:
        return None


def committed(
    directory: Path,
    family: Family,
    *,
    newest_first: bool = False,
    storage: Storage | None = None,
) -> list[Checkpoint]:
    """Return every committed checkpoint of ``family`` in ``directory``, by step.

    One directory listing; a record is read only for a numbered file that has
    one beside it (thousands of checkpoints open in about a second).
    """
    storage = storage or default_storage()
    entries = dict(storage.names(directory))
    found = []
    for name, kind in entries.items():
        step = family.step_of(name)
        if step is None or kind != "file" or entries.get(record_name(name)) != "file":
            continue
        path = directory / name
        record = read_record_or_none(path, storage=storage)
        if record is not None and (record.step, record.family) == (step, family.prefix):
            found.append(Checkpoint(path, step, family.prefix, record))
    return sorted(found, key=lambda c: c.step, reverse=newest_first)


def uncommitted(
    directory: Path, family: Family, *, storage: Storage | None = None
) -> list[Path]:
    """Return the numbered files of ``family`` that have no usable record."""
    storage = storage or default_storage()
    return [
        directory / name
        for name, kind in storage.names(directory)
        if kind == "file"
        and family.step_of(name) is not None
        and read_record_or_none(directory / name, storage=storage) is None
    ]


def recorded_families(
    directory: Path, suffix: str, *, storage: Storage | None = None
) -> set[str]:
    """Return the prefixes named by the commit records in ``directory``."""
    storage = storage or default_storage()
    targets = [record_target(name) for name, _ in entries_of(directory, storage)]
    records = [
        read_record_or_none(directory / target, storage=storage)
        for target in targets
        if target is not None and target.endswith(suffix)
    ]
    return {record.family for record in records if record is not None}
