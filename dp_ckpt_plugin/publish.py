"""Publication: moving a family's pointer, alias and mirrors to a checkpoint.

Publication is one of the store's invariant steps, run after the commit record
exists: the in-store pointer (a one-line file naming the checkpoint relative to
the store), the in-store alias (a symlink, else a hard link or copy) and any
*mirrors* a host configures outside the store (deepmd-kit's working-directory
``checkpoint`` pointer and the alias beside its ``save_ckpt`` prefix), each
holding a path relative to its own directory. Every update is atomic. If one
fails, every target already moved is put back as it was, so ``latest`` goes
on naming the previous checkpoint everywhere (rule 8).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import fsio
from .errors import CheckpointWriteError
from .pointers import read_link_or_none, read_text_or_none


@dataclass(frozen=True)
class Mirror:
    """A pointer or alias outside the store kept up to date with the family's.

    Attributes
    ----------
    path : Path
        The mirror file (absolute).
    kind : {"pointer", "alias"}
        A one-line text pointer, or an alias link.
    """

    path: Path
    kind: Literal["pointer", "alias"]

    def __post_init__(self) -> None:
        if self.kind not in ("pointer", "alias"):
            raise ValueError(
                f"a mirror is a 'pointer' or an 'alias', not {self.kind!r}"
            )


@dataclass(frozen=True)
class _Before:
    """What one publication target held before, to put it back."""

    target: Mirror
    existed: bool
    text: str | None
    link: str | None


def publish(
    checkpoint: Path,
    targets: Iterable[Mirror],
    *,
    durable: bool = True,
) -> None:
    """Point every target at ``checkpoint``, all or none.

    Parameters
    ----------
    checkpoint : Path
        The committed checkpoint (absolute).
    targets : iterable of Mirror
        The in-store pointer and alias first, then the host's mirrors.
    durable : bool, optional
        Whether to fsync the directories.

    Raises
    ------
    CheckpointWriteError
        Naming the target and the cause, after every target was put back.
    """
    done: list[_Before] = []
    try:
        for target in targets:
            done.append(
                _Before(
                    target,
                    os.path.lexists(target.path),
                    read_text_or_none(target.path),
                    read_link_or_none(target.path),
                )
            )
            rel = os.path.relpath(checkpoint, target.path.parent)
            if target.kind == "pointer":
                fsio.write_text_atomic(
                    target.path, rel + "\n", durable=durable, sync_dir=False
                )
            else:
                fsio.replace_link(target.path, rel, durable=durable, sync_dir=False)
        # one fsync per directory, after every move: the moves are atomic one
        # by one, and each names a committed checkpoint, so their order on
        # disk does not matter; the fsync makes them survive a power loss
        if durable:
            by_directory: dict[Path, list[Path]] = {}
            for before in done:
                path = before.target.path
                by_directory.setdefault(path.parent, []).append(path)
            for directory, paths in by_directory.items():
                fsio.fsync_directory(directory, holding=paths)
    except CheckpointWriteError:
        for before in reversed(done):
            _put_back(before, durable=durable)
        raise


def _put_back(before: _Before, *, durable: bool) -> None:
    """Restore one target after a failed publication; best effort."""
    path = before.target.path
    with contextlib.suppress(OSError):
        if not before.existed:
            fsio.remove_file(path)
        elif before.target.kind == "pointer" and before.text is not None:
            fsio.write_text_atomic(path, before.text, durable=durable)
        elif before.target.kind == "alias" and before.link is not None:
            fsio.replace_link(path, before.link, durable=durable)
        # an alias that was a copy (no symlinks here) stays as it is now
