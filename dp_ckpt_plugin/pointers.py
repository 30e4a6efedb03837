"""Reading pointers and aliases without being led astray.

A pointer is a one-line text file naming a checkpoint (relative to the
pointer's own directory, or absolute); an alias is a symlink (or, where
symlinks cannot be made, a hard link or copy). Both are read defensively: a
malformed pointer raises :class:`~dp_ckpt_plugin.errors.UnsafePointerError`,
which resolution reports and skips. Resolution follows a target outside the
directory holding the pointer only when it is provably a committed checkpoint
(its record verifies), so a planted pointer cannot make the plugin read an
arbitrary file while the plugin's own mirrors always resolve.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UnsafePointerError

_MAX_POINTER_BYTES = 4096


def read_pointer(pointer: Path) -> Path | None:
    """Read a pointer file and return its target path, or ``None`` if absent.

    Where the target lies is the caller's to judge (:func:`is_inside`).

    Raises
    ------
    UnsafePointerError
        When the pointer is malformed: a directory, binary, empty, several
        lines or over 4 KiB.
    """
    try:
        with open(pointer, "rb") as handle:
            raw = handle.read(_MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UnsafePointerError(
            f"pointer {pointer} is a directory, not a file"
        ) from None
    if len(raw) > _MAX_POINTER_BYTES or b"\0" in raw:
        raise UnsafePointerError(
            f"pointer {pointer} is not a text file naming a checkpoint"
        )
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UnsafePointerError(
            f"pointer {pointer} is not UTF-8 text naming a checkpoint"
        ) from None
    if not text:
        raise UnsafePointerError(f"pointer {pointer} is empty")
    if "\n" in text:
        raise UnsafePointerError(f"pointer {pointer} holds more than one line")
    target = Path(text)
    if not target.is_absolute():
        # deepmd-kit writes the working-directory pointer relative to the
        # working directory, which is the pointer's own directory.
        target = pointer.parent / target
    return target


def is_inside(target: Path, roots: list[Path]) -> bool:
    """Whether ``target``, symlinks followed, lies under one of ``roots``."""
    real = Path(os.path.realpath(target))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if real == real_root or real_root in real.parents:
            return True
    return False


def read_text_or_none(path: Path) -> str | None:
    """Return a small text file's content, or ``None`` if it cannot be read."""
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def read_link_or_none(path: Path) -> str | None:
    """Return a symlink's target as written, or ``None`` if it is no symlink."""
    try:
        return os.readlink(path)
    except OSError:
        return None
