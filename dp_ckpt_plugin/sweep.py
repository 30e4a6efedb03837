"""Sweeping what a killed writer left behind.

Only names the store itself generates are removed: temporary files (a dot, the
final name, the temporary marker) in the store and beside its mirrors, and
commit records whose checkpoint is gone (a kill between the two unlinks of a
prune). Safe only while holding the store's lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from .layout import is_temp, record_target


def sweep(directory: Path, mirrors: Iterable[Path] = ()) -> list[Path]:
    """Remove leftovers in ``directory`` and beside ``mirrors``; return them."""
    removed = []
    for name in _names(directory):
        target = record_target(name)
        orphan = target is not None and not os.path.lexists(directory / target)
        if orphan or is_temp(name):
            _remove(directory / name, removed)
    for mirror in mirrors:
        if mirror.parent == directory:
            continue
        for name in _names(mirror.parent):
            if is_temp(name) and name.startswith(f".{mirror.name}.tmp-"):
                _remove(mirror.parent / name, removed)
    return removed


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _remove(path: Path, removed: list[Path]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
        removed.append(path)
