"""Sweeping what a killed writer left behind, and nothing else (rule 15).

Only names the store itself generates are removed, and only those that belong
to the store's own files:

- temporary files of the exact form the store makes (a dot, the final name,
  ``.tmp-``, a pid, eight hex digits) whose final name is one the store
  writes: a numbered checkpoint of a configured family, its commit record, a
  family's pointer or alias, the lock's holder file, the store's manifest;
  beside a mirror, only temporaries of that mirror's own name;
- commit records of a configured family whose checkpoint is gone (a kill
  between the two unlinks of a prune). A record whose checkpoint was moved
  into an archive (a kill between the two moves of an archive) follows it
  there instead.

A user's dot-files, files of other families and files without a record are
never touched, so ``save_dir: "."`` is safe. Safe only while holding the
store's lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from .layout import (
    HOLDER_NAME,
    MANIFEST_NAME,
    Family,
    record_name,
    record_target,
    temp_target,
)

#: Folder of a store where earlier runs are moved (see :mod:`.archive`).
ARCHIVE_DIR = "archive"


def sweep(
    directory: Path, families: Iterable[Family], mirrors: Iterable[Path] = ()
) -> list[Path]:
    """Remove leftovers in ``directory`` and beside ``mirrors``; return them."""
    families = list(families)
    removed = []
    for name in _names(directory):
        target = temp_target(name)
        if target is not None and _ours(target, families):
            _remove(directory / name, removed)
            continue
        checkpoint = record_target(name)
        if (
            checkpoint is not None
            and _numbered(checkpoint, families)
            and not os.path.lexists(directory / checkpoint)
        ) and not _follow_into_archive(directory, checkpoint):
            _remove(directory / name, removed)
    for mirror in mirrors:
        if mirror.parent == directory:
            continue
        for name in _names(mirror.parent):
            if temp_target(name) == mirror.name:
                _remove(mirror.parent / name, removed)
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


def _follow_into_archive(directory: Path, checkpoint: str) -> bool:
    """Move an orphan record to the archive folder its checkpoint went to."""
    for folder in sorted(_names(directory / ARCHIVE_DIR), reverse=True):
        dest = directory / ARCHIVE_DIR / folder
        if (dest / checkpoint).is_file() and not os.path.lexists(
            dest / record_name(checkpoint)
        ):
            with contextlib.suppress(OSError):
                os.replace(
                    directory / record_name(checkpoint), dest / record_name(checkpoint)
                )
                return True
    return False


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _remove(path: Path, removed: list[Path]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
        removed.append(path)
