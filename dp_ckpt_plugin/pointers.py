"""Reading pointers and aliases without being led astray.

A pointer is a one-line text file naming a checkpoint (relative to the
pointer's own directory, or absolute); an alias is a symlink (or, where
symlinks cannot be made, a hard link or copy). Both are read defensively: a
malformed pointer, or one leading outside the directories it may name, raises
:class:`~dp_ckpt_plugin.errors.UnsafePointerError`, which resolution reports and
skips, so a planted pointer cannot make the plugin read an arbitrary file.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UnsafePointerError

_MAX_POINTER_BYTES = 4096


def read_pointer(pointer: Path, roots: list[Path]) -> Path | None:
    """Read a pointer file and return its target path, or ``None`` if absent.

    Raises
    ------
    UnsafePointerError
        When the pointer is malformed or names a path outside ``roots``.
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
    check_inside(target, roots, what=f"pointer {pointer}")
    return target


def check_inside(target: Path, roots: list[Path], *, what: str) -> None:
    """Raise :class:`UnsafePointerError` unless ``target`` lies under a root."""
    real = Path(os.path.realpath(target))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if real == real_root or real_root in real.parents:
            return
    raise UnsafePointerError(
        f"{what} leads to {real}, outside {', '.join(str(r) for r in roots)}; refusing to follow it"
    )


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
