"""Reading pointers and aliases without being led astray.

A pointer is a one-line text file naming a checkpoint (relative to the
pointer's own directory, or absolute); an alias is a symlink (or, where
symlinks cannot be made, a hard link or copy). Both are read defensively,
through a :class:`~dp_ckpt_plugin.storage.Storage`: a malformed pointer (or a
FIFO, a directory or a link where the pointer should be) raises
:class:`~dp_ckpt_plugin.errors.UnsafePointerError`, which resolution reports
and skips. Resolution follows a target outside the directory holding the
pointer only when it is provably a committed checkpoint (its record
verifies), so a planted pointer cannot make the plugin read an arbitrary file
while the plugin's own mirrors always resolve.

:func:`named_by` is the one answer to "which checkpoints do a family's pointer
and alias name", used by retention, archiving and the commands.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UnreadableFileError, UnsafePointerError
from ..storage import Storage, default_storage
from .layout import Family
from .limits import MAX_POINTER_BYTES


def read_pointer(pointer: Path, *, storage: Storage | None = None) -> Path | None:
    """Read a pointer file and return its target path, or ``None`` if absent.

    Where the target lies is the caller's to judge (:func:`is_inside`).

    Raises
    ------
    UnsafePointerError
        When the pointer is malformed: not a regular file, binary, empty,
        several lines or over 4 KiB.
    """
    storage = storage or default_storage()
    try:
        raw = storage.read_small(pointer, MAX_POINTER_BYTES)
    except UnreadableFileError as exc:
        raise UnsafePointerError(f"pointer {exc}") from None
    if raw is None:
        return None
    if b"\0" in raw:
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
    if "\n" in text or "\r" in text:
        raise UnsafePointerError(f"pointer {pointer} holds more than one line")
    # a relative target is read from the pointer's own directory (deepmd-kit
    # writes the working-directory pointer relative to the working directory);
    # an absolute one stays as it is, by pathlib's own rule for joining
    return pointer.parent / text


def pointer_text(checkpoint: Path, pointer: Path) -> str:
    """What a pointer at ``pointer`` holds to name ``checkpoint``.

    The path relative to the pointer's directory, with no newline: byte for
    byte what deepmd-kit writes, and what it reads back with no strip.
    """
    return os.path.relpath(checkpoint, pointer.parent)


def is_inside(target: Path, roots: list[Path], *, storage: Storage) -> bool:
    """Whether ``target``, symlinks followed, lies under one of ``roots``."""
    real = storage.real(target)
    return any(
        real == root or root in real.parents for root in map(storage.real, roots)
    )


def link_or_pointer_target(path: Path, *, storage: Storage) -> str | None:
    """The file name a pointer or alias at ``path`` names, or ``None``.

    A symlink's target (as written) or a readable pointer's line; anything
    unreadable or malformed names nothing.
    """
    linked = storage.link_target(path)
    return Path(linked).name if linked else _named(path, storage)


def _named(pointer: Path, storage: Storage) -> str | None:
    """The file name a readable pointer names; ``None`` for none or a malformed one."""
    try:
        named = read_pointer(pointer, storage=storage)
    except UnsafePointerError:
        return None
    return named.name if named is not None else None


def named_by(
    directory: Path, family: Family, *, storage: Storage
) -> dict[str, str | None]:
    """The file names the family's pointer and alias in ``directory`` name.

    Returns ``{"pointer": name or None, "alias": name or None}``.
    """
    linked = storage.link_target(directory / family.alias)
    return {
        "pointer": _named(directory / family.pointer, storage),
        "alias": Path(linked).name if linked else None,
    }
