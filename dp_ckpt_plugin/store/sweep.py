"""Sweeping what a killed writer left behind, and nothing else (rule 15).

Only names the store itself generates are removed, and only those that belong
to the store's own files:

- temporary files of the exact form the store makes (a dot, the final name,
  ``.tmp-``, a pid, eight hex digits) whose final name is one the store
  writes: a numbered checkpoint of a configured family, its commit record, a
  family's pointer or alias, the lock's holder file, the store's manifest;
  beside a mirror, only temporaries of that mirror's own name; a directory
  of that form (where a payload's temporary file is linked under its final
  name while it is written) goes with that link, and only if nothing else
  is in it;
- commit records of a configured family whose checkpoint is gone (a kill
  between the two unlinks of a prune, or a prune whose record removal waits
  for the next save). A record whose checkpoint was moved into an archive (a
  kill between the two moves of an archive) follows it there instead.

A user's dot-files, files of other families and files without a record are
never touched, so ``save_dir: "."`` is safe. Safe only while holding the
store's lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from ..checkpoint.layout import (
    ARCHIVE_DIR,
    HOLDER_NAME,
    MANIFEST_NAME,
    Family,
    record_name,
    record_target,
)
from ..errors import CheckpointWriteError
from ..storage import Storage, entries_of
from ..storage.temp import remove_counted, remove_leftover, temp_target


def sweep(
    directory: Path,
    families: Iterable[Family],
    mirrors: Iterable[Path] = (),
    *,
    storage: Storage,
) -> list[Path]:
    """Remove leftovers in ``directory`` and beside ``mirrors``; return them."""
    families = list(families)
    removed = []
    entries = dict(entries_of(directory, storage))
    for name, kind in entries.items():
        target = temp_target(name)
        if target is not None and _ours(target, families):
            remove_leftover(directory / name, kind, removed, storage)
            continue
        checkpoint = record_target(name) or ""  # "": not a record
        orphan = _numbered(checkpoint, families) and checkpoint not in entries
        if orphan and not _follow_into_archive(directory, checkpoint, storage):
            remove_counted(directory / name, removed, storage)
    for mirror in (m for m in mirrors if m.parent != directory):
        for name, _ in entries_of(mirror.parent, storage):
            if temp_target(name) == mirror.name:
                remove_counted(mirror.parent / name, removed, storage)
    return removed


def _numbered(name: str, families: list[Family]) -> bool:
    return any(f.step_of(name) is not None for f in families)


def _ours(target: str, families: list[Family]) -> bool:
    """Whether ``target`` is a name the store writes in its directory."""
    if target in (HOLDER_NAME, MANIFEST_NAME) or _numbered(target, families):
        return True
    if any(target in (f.pointer, f.alias) for f in families):
        return True
    checkpoint = record_target(target)
    return checkpoint is not None and _numbered(checkpoint, families)


def _follow_into_archive(directory: Path, checkpoint: str, storage: Storage) -> bool:
    """Move an orphan record to the archive folder its checkpoint went to."""
    root = directory / ARCHIVE_DIR
    record = record_name(checkpoint)
    found = storage.entry(root)
    if found is None or not found.is_dir:
        return False  # a link there leads out of the store: never followed
    for folder, kind in sorted(entries_of(root, storage), reverse=True):
        dest = root / folder
        if kind != "dir":
            continue
        inside = dict(entries_of(dest, storage))
        if inside.get(checkpoint) == "file" and record not in inside:
            with contextlib.suppress(CheckpointWriteError):
                storage.rename(directory / record, dest / record)
                return True
    return False
