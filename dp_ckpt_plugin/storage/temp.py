"""Temporary names: how a file being written is named until it counts.

A temporary name is a dot, the final name, a marker, the writer's pid and
eight hex digits: no glob of a store's numbered files or aliases matches it,
and a sweep can tell whose it is and what it was meant to become. The
storage makes every file under such a name first; only the storage and the
sweep of what a killed writer left behind read them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CheckpointWriteError
from . import entries_of

if TYPE_CHECKING:
    from . import Storage


_TEMP_MARK = ".tmp-"


#: Exactly the temporary names :func:`temp_name` makes: a dot, the final name,
#: the marker, the writer's pid and eight hex digits.
_TEMP_RE = re.compile(r"\.(?P<final>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}", re.DOTALL)


def temp_name(final_name: str) -> str:
    """Return a fresh temporary name for writing ``final_name`` in place."""
    return f".{final_name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


def temp_target(name: str) -> str | None:
    """Return the final name a temporary file was meant for, or ``None``."""
    found = _TEMP_RE.fullmatch(name)
    return found.group("final") if found else None


def temp_pid(name: str) -> int | None:
    """Return the pid of the process that made a temporary name, or ``None``."""
    found = _TEMP_RE.fullmatch(name)
    return int(found.group("pid")) if found else None


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
        remove_counted(path, removed, storage)
        return
    final = temp_target(path.name)
    for name, inside in entries_of(path, storage):
        if name == final and inside != "dir":
            remove_counted(path / name, [], storage)
    if storage.remove_dir(path):
        removed.append(path)


def remove_counted(path: Path, removed: list[Path], storage: Storage) -> None:
    with contextlib.suppress(CheckpointWriteError):
        if storage.remove(path):
            removed.append(path)
