"""Publication: moving a family's pointer, alias and mirrors to a checkpoint.

Publication is one of the store's invariant steps, run after the commit record
exists: the in-store pointer (a one-line file naming the checkpoint relative to
the store, in deepmd-kit's own format: no newline), the in-store alias (a
symlink, else a hard link or copy) and any *mirrors* a host configures outside
the store (deepmd-kit's working-directory ``checkpoint`` pointer and the alias
beside its ``save_ckpt`` prefix), each holding a path relative to its own
directory. Every update is atomic. If one fails, every target already moved is
put back as it was, so ``latest`` goes on naming the previous checkpoint
everywhere (rule 8). What is remembered to put a target back is its link
target or its pointer line, never a payload: publication reads no checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..checkpoint.pointers import MAX_POINTER_BYTES, pointer_text
from ..errors import CheckpointWriteError, UnreadableFileError
from ..storage import Storage
from ..storage.payload import at_once
from .catalogue import Catalogue


@dataclass(frozen=True)
class Mirror:
    """A pointer or alias outside the store kept up to date with the family's.

    Attributes
    ----------
    path : Path
        The mirror file (absolute).
    kind : {"pointer", "alias"}
        A one-line text pointer, or an alias link.
    sync : bool
        Whether a pointer's bytes are fsynced before it takes its name. The
        store's own pointer is not: one that lost its bytes in a power loss
        is empty, and resolution skips it for the alias and the newest
        committed checkpoint. A mirror that plain deepmd-kit reads is.
    """

    path: Path
    kind: Literal["pointer", "alias"]
    sync: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("pointer", "alias"):
            raise ValueError(
                f"a mirror is a 'pointer' or an 'alias', not {self.kind!r}"
            )


class Publisher:
    """What a store's families publish, step after step.

    The checkpoint just written; for a family ranked by a metric (its policy
    is ``ranked``, as :class:`~dp_ckpt_plugin.retention.KeepBest` is), its
    ``leader``: its best. Never a step below one this publisher published already: a save
    that finishes late (another thread's) does not move ``latest`` back.

    ``catalogue``: the store's committed checkpoints (a family ranked by a
    metric picks its leader among them, up to the step published) and its
    place.
    """

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self.place = catalogue.place
        self._steps: dict[str, int] = {}

    def publish(self, config, checkpoint, *, overlap: bool = True) -> Path:
        """Publish what ``config``'s family names after ``checkpoint``; return it.

        ``overlap``: whether mirrored pointers are written beside the fsync
        of the store directory (:func:`publish`); off for a background save.
        """
        place, directory, family = self.place, self.place.directory, config.family
        chosen, step = checkpoint.path, checkpoint.step
        last = self._steps.get(family.prefix, -1)
        if config.policy.ranked:
            best = config.policy.leader(self.catalogue.candidates(family, up_to=step))
            chosen = directory / best.name if best is not None else chosen
        elif step < last:
            if place.durable:  # the new payload's name, which publication makes durable
                place.storage.sync_dir(directory, holding=[checkpoint.path])
            return directory / family.numbered(last)
        publish(
            chosen,
            targets(directory, family, config.mirrors),
            storage=place.storage,
            durable=place.durable,
            overlap=overlap,
        )
        self._steps[family.prefix] = max(step, last)
        return chosen


def targets(directory: Path, family, mirrors: Iterable[Mirror] = ()) -> list[Mirror]:
    """A family's in-store pointer and alias, then its mirrors (no repeats)."""
    unique: dict[Path, Mirror] = {}
    for target in (
        Mirror(directory / family.pointer, "pointer", sync=False),
        Mirror(directory / family.alias, "alias"),
        *mirrors,
    ):
        unique.setdefault(target.path, target)
    return list(unique.values())


@dataclass(frozen=True)
class _Before:
    """What one publication target held before, to put it back."""

    target: Mirror
    existed: bool
    text: bytes | None
    link: str | None


def _before(target: Mirror, storage: Storage) -> _Before:
    """Remember a target's link or pointer line (a few bytes, never a payload)."""
    found = storage.entry(target.path)
    if found is None:
        return _Before(target, False, None, None)
    link = storage.link_target(target.path) if found.kind == "link" else None
    text = None
    if target.kind == "pointer" and found.is_file:
        with contextlib.suppress(UnreadableFileError):
            text = storage.read_small(target.path, MAX_POINTER_BYTES)
    return _Before(target, True, text, link)


def publish(
    checkpoint: Path,
    targets: Iterable[Mirror],
    *,
    storage: Storage,
    durable: bool = True,
    overlap: bool = True,
) -> None:
    """Point every target at ``checkpoint``, all or none.

    Parameters
    ----------
    checkpoint : Path
        The committed checkpoint (absolute).
    targets : iterable of Mirror
        The in-store pointer and alias first, then the host's mirrors.
    storage : Storage
        Where the files are.
    durable : bool, optional
        Whether to fsync the directories.
    overlap : bool, optional
        Whether the mirrored pointers' bytes are written and fsynced beside
        the fsync of the first directory (else each before its own move).

    Raises
    ------
    CheckpointWriteError
        Naming the target and the cause, after every target was put back.
    """
    by_directory: dict[Path, list[Mirror]] = {}
    for target in targets:
        by_directory.setdefault(target.path.parent, []).append(target)
    groups = list(by_directory.items())
    later = [  # the pointers whose bytes a first directory's fsync may overlap
        t for _, group in groups[1:] for t in group if t.kind == "pointer" and t.sync
    ]
    done: list[_Before] = []
    written: dict[Path, Path] = {}  # a later pointer -> its fsynced temporary file
    try:
        # directory by directory, in the order given (the store's own first):
        # its targets move, then one fsync of it. Within a directory the order
        # on disk does not matter (each move is atomic and names a committed
        # checkpoint); the fsync of the store directory also makes the new
        # payload's name durable before any mirror elsewhere names it. The
        # bytes of the later directories' pointers are written and fsynced
        # under their temporary names beside that first fsync (no name of
        # theirs changes before it returns)
        for index, (directory, group) in enumerate(groups):
            for target in group:
                done.append(_before(target, storage))
                ready = written.pop(target.path, None)  # its bytes written already
                _move(
                    target, checkpoint, storage=storage, durable=durable, written=ready
                )
            if durable:
                sync = functools.partial(
                    storage.sync_dir, directory, holding=[t.path for t in group]
                )
                if index == 0 and later and overlap:
                    at_once(
                        functools.partial(
                            _write_pointers, later, checkpoint, storage, written
                        ),
                        sync,
                    )
                else:
                    sync()
    except CheckpointWriteError:
        for tmp in written.values():
            storage.remove_quietly(tmp)
        for before in reversed(done):
            _put_back(before, storage, durable=durable)
        raise


def _write_pointers(
    pointers: list[Mirror], checkpoint: Path, storage: Storage, written: dict
) -> None:
    """Write (and fsync) each pointer's text naming ``checkpoint`` under a temporary name."""
    for target in pointers:
        data = pointer_text(checkpoint, target.path).encode("utf-8")
        written[target.path] = storage.write_temp(
            target.path, lambda handle, data=data: handle.write(data), durable=True
        )


def _move(
    target: Mirror,
    checkpoint: Path,
    *,
    storage: Storage,
    durable: bool,
    written: Path | None = None,
) -> None:
    """Point one target at ``checkpoint`` (atomic; its directory not fsynced).

    ``written``: a pointer's temporary file, already written (and fsynced).
    """
    if written is not None:
        storage.move_into_place(written, target.path, durable=False)
    elif target.kind == "pointer":
        data = pointer_text(checkpoint, target.path).encode("utf-8")
        storage.write_atomic(
            target.path, data, durable=durable and target.sync, sync_dir=False
        )
    else:
        rel = os.path.relpath(checkpoint, target.path.parent)
        storage.make_link(target.path, rel, durable=durable, sync_dir=False)


def _put_back(before: _Before, storage: Storage, *, durable: bool) -> None:
    """Restore one target after a failed publication; best effort."""
    path = before.target.path
    with contextlib.suppress(OSError, CheckpointWriteError):
        if not before.existed:
            storage.remove(path)
        elif before.link is not None:
            storage.make_link(path, before.link, durable=durable)
        elif before.text is not None:
            storage.write_atomic(path, before.text, durable=durable)
        # an alias that was a copy (no symlinks here) stays as it is now
