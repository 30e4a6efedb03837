"""The write transaction: a durable payload, then its commit record.

Two cases, each leaving at every instant (and in every state a crash can
leave on disk) either the previous committed state or the new one:

- :func:`write_new`, the first save of a step: the format writes a temporary
  file beside the final name, which is fsynced and hashed; the commit record
  is written atomically and durably; then the payload is moved into place and
  the directory fsynced. The checkpoint counts once both exist and agree. A
  crash in between leaves a record naming no file (the next open sweeps it),
  never a full-size numbered file without a record.
- :func:`rewrite`, a re-save of a step this run committed already (deepmd-kit
  does it after ``change_bias_after_training``): the new payload is written
  to a temporary file; a record accepting *either* payload (``replaces``)
  replaces the old record; the new payload replaces the old one; the final
  record replaces the double one. Each step is made durable before the next.

Each step cleans up after itself on failure and raises
:class:`~dp_ckpt_plugin.errors.CheckpointWriteError` naming the path and the
cause (rule 8).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, NoReturn

from ..checkpoint import Checkpoint
from ..checkpoint.catalogue import Catalogue, read_record_or_none
from ..checkpoint.digests import write_hashed
from ..checkpoint.layout import Family
from ..checkpoint.records import CommitRecord, make_record, record_path, write_record
from ..errors import CheckpointWriteError
from ..storage import Storage
from .archive import archive

log = logging.getLogger("dp_ckpt_plugin")

#: Headroom asked for beyond the previous checkpoint's size before a write.
SPACE_HEADROOM = 1.05


class Committer:
    """Writes and commits a store's checkpoints, never over another run's.

    A step this run committed already is rewritten (:func:`rewrite`); a file
    at the name that this run did not write (an earlier run's, a user's) is
    archived first, never overwritten; otherwise :func:`write_new`. Before
    each write, free space is checked against the family's previous size.

    Parameters
    ----------
    directory : Path
        The store directory.
    catalogue : Catalogue
        Its committed checkpoints.
    storage : Storage
        Where the files are.
    durable : bool
        Whether to fsync.
    check_free_space : bool
        Whether to refuse a write when space is short.
    """

    def __init__(
        self,
        directory: Path,
        catalogue: Catalogue,
        storage: Storage,
        *,
        durable: bool,
        check_free_space: bool,
    ) -> None:
        self.directory = directory
        self.catalogue = catalogue
        self.storage = storage
        self.durable = durable
        self.check_free_space = check_free_space
        self.written: set[str] = set()

    def commit(
        self,
        path: Path,
        serialize: Callable[[BinaryIO], object],
        *,
        step: int,
        family: Family,
        format: str,
        metrics: Mapping[str, float] | None,
    ) -> CommitRecord:
        """Write and commit ``path``; return its record."""
        self._check_space(family, path)
        details = {
            "step": step,
            "family": family.prefix,
            "format": format,
            "durable": self.durable,
            "storage": self.storage,
            "metrics": metrics,
        }
        # publication, next, fsyncs the directory after the pointer and alias
        # moved: the payload's name is made durable with them
        fresh = {"sync_name": False}
        if self.storage.entry(path) is not None:
            old = read_record_or_none(path, storage=self.storage)
            if old is not None and path.name in self.written:
                return rewrite(path, serialize, old=old, **details)
            # an earlier run's checkpoint, or a file that is not ours: keep it
            dest = archive(
                self.directory,
                [Checkpoint(path, step, family.prefix, old)],
                storage=self.storage,
                durable=self.durable,
            )
            self.catalogue.discard(family, path.name)
            log.info("moved %s, written before this run, to %s", path, dest)
        record = write_new(path, serialize, **details, **fresh)
        self.written.add(path.name)
        return record

    def _check_space(self, family: Family, path: Path) -> None:
        newest = self.catalogue.newest(family) if self.check_free_space else None
        if newest is None:
            return
        free = self.storage.free_bytes(self.directory)
        if free is not None and free < int(newest.record.size * SPACE_HEADROOM):
            raise CheckpointWriteError(
                f"could not write {path}: not enough space ({free} bytes free, "
                f"the previous checkpoint took {newest.record.size})"
            )


def serializer(hooks, format: str, step: int, state) -> Callable[[BinaryIO], object]:
    """What writes ``state``: the format's ``on_save_step``, or, for a snapshot
    in shared memory, the writer process (it has ``write_remotely``)."""
    if hasattr(state, "write_remotely"):
        return state
    return functools.partial(hooks.save_step, format, step, state)


def write_new(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    step: int,
    family: str,
    format: str,
    durable: bool,
    storage: Storage,
    metrics: Mapping[str, float] | None = None,
    sync_name: bool = True,
) -> CommitRecord:
    """Write and commit the first checkpoint of a step at ``path`` (absent).

    The payload is written and fsynced under a temporary name and hashed;
    its record is written (durably) before the payload gets its name, so no
    crash can leave a full-size numbered file without a record: a crash
    leaves at most a record naming no file, which the next open sweeps.
    Without ``sync_name`` the directory is not fsynced after the payload's
    move: the caller does it (the store's publication fsyncs ``D`` after
    moving the pointer and alias, one fsync for the three names).
    """
    tmp, record = _described_payload(
        path,
        serialize,
        durable,
        storage,
        step=step,
        family=family,
        format=format,
        metrics=metrics,
    )
    try:
        write_record(path, record, durable=durable, storage=storage)
        storage.move_into_place(tmp, path, durable=durable and sync_name)
    except (OSError, CheckpointWriteError) as exc:
        # nothing of this step may stay: the temporary file, the record, and
        # a payload whose name might not survive (its directory fsync failed)
        _undo(exc, path, (tmp, path, record_path(path)), storage)
    return record


def rewrite(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    old: CommitRecord,
    step: int,
    family: str,
    format: str,
    durable: bool,
    storage: Storage,
    metrics: Mapping[str, float] | None = None,
) -> CommitRecord:
    """Re-save a step whose committed checkpoint (``old``) is at ``path``."""
    tmp, new = _described_payload(
        path,
        serialize,
        durable,
        storage,
        step=step,
        family=family,
        format=format,
        metrics=metrics,
    )
    try:
        both = dataclasses.replace(new, replaces=(old.size, old.digest))
        write_record(path, both, durable=durable, storage=storage)
    except (OSError, CheckpointWriteError) as exc:
        _undo(exc, path, (tmp,), storage)
    # from here on the double record stands whatever fails: it accepts the
    # old payload (the move failed) and the new one (the move happened)
    storage.move_into_place(tmp, path, durable=durable)
    write_record(path, new, durable=durable, storage=storage)
    return new


def _described_payload(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    durable: bool,
    storage: Storage,
    **fields,
) -> tuple[Path, CommitRecord]:
    """Write the payload of ``path`` to a temporary file and describe it.

    Returns the temporary path and the record for ``path`` (``fields``: step,
    family, format, metrics); on failure the temporary file is removed.
    """
    tmp, digest = write_hashed(path, serialize, durable=durable, storage=storage)
    try:
        return tmp, make_record(
            tmp, name=path.name, digest=digest, storage=storage, **fields
        )
    except OSError as exc:
        _undo(exc, path, (tmp,), storage)


def _undo(
    exc: OSError, path: Path, leftovers: tuple[Path, ...], storage: Storage
) -> NoReturn:
    """Remove ``leftovers`` of a failed commit of ``path``; raise the error."""
    for leftover in leftovers:
        storage.remove_quietly(leftover)
    if isinstance(exc, CheckpointWriteError):
        raise exc
    raise CheckpointWriteError(
        f"could not commit {path}: {exc.strerror or exc}"
    ) from exc
