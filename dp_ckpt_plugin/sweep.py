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

from .errors import CheckpointWriteError, UnreadableFileError
from .layout import (
    ARCHIVE_DIR,
    HOLDER_NAME,
    MANIFEST_NAME,
    Family,
    record_name,
    record_target,
    temp_target,
)
from .storage import Storage


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
    entries = dict(_names(directory, storage))
    for name in entries:
        target = temp_target(name)
        if target is not None and _ours(target, families):
            remove_leftover(directory / name, entries[name], removed, storage)
            continue
        checkpoint = record_target(name)
        if (
            checkpoint is not None
            and _numbered(checkpoint, families)
            and checkpoint not in entries
        ) and not _follow_into_archive(directory, checkpoint, storage):
            _remove(directory / name, removed, storage)
    for mirror in mirrors:
        if mirror.parent == directory:
            continue
        for name, _ in _names(mirror.parent, storage):
            if temp_target(name) == mirror.name:
                _remove(mirror.parent / name, removed, storage)
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
    found = storage.entry(root)
    if found is None or not found.is_dir:
        return False  # a link there leads out of the store: never followed
    for folder, kind in sorted(_names(root, storage), reverse=True):
        dest = root / folder
        if kind != "dir":
            continue
        inside = dict(_names(dest, storage))
        if inside.get(checkpoint) == "file" and record_name(checkpoint) not in inside:
            with contextlib.suppress(CheckpointWriteError):
                storage.rename(
                    directory / record_name(checkpoint), dest / record_name(checkpoint)
                )
                return True
    return False


def _names(directory: Path, storage: Storage) -> list[tuple[str, str]]:
    try:
        return storage.names(directory)
    except UnreadableFileError:
        return []


def remove_leftover(
    path: Path, kind: str, removed: list[Path], storage: Storage
) -> None:
    """Remove a temporary file, or a temporary directory and the link it holds.

    The store puts one entry in such a directory: a link to a payload's
    temporary file under the payload's final name. Only that entry goes
    (never a directory, nothing below followed), then the directory if it
    is empty; anything else in it stays, and so does the directory.
    """
    if kind != "dir":
        _remove(path, removed, storage)
        return
    final = temp_target(path.name)
    for name, inside in _names(path, storage):
        if name == final and inside != "dir":
            _remove(path / name, [], storage)
    if storage.remove_dir(path):
        removed.append(path)


def _remove(path: Path, removed: list[Path], storage: Storage) -> None:
    with contextlib.suppress(CheckpointWriteError):
        if storage.remove(path):
            removed.append(path)
