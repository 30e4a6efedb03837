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
from typing import Any, BinaryIO, NoReturn

from ..checkpoint import Checkpoint
from ..checkpoint.catalogue import read_record_or_none
from ..checkpoint.digests import digest_of_view, write_hashed
from ..checkpoint.layout import Family
from ..checkpoint.limits import MAX_INPUT_BYTES
from ..checkpoint.lineage import Lineage
from ..checkpoint.provenance import Provenance, input_digest, input_fits, write_input
from ..checkpoint.records import (
    CommitRecord,
    check_saves,
    make_record,
    record_path,
    write_record,
)
from ..errors import CheckpointWriteError
from ..storage import Storage
from ..storage.payload import at_once
from .archive import archive
from .catalogue import Catalogue

log = logging.getLogger("dp_ckpt_plugin")

#: Headroom asked for beyond the previous checkpoint's size before a write.
SPACE_HEADROOM = 1.05


class Committer:
    """Writes and commits a store's checkpoints, never over another run's.

    A step this run committed already is rewritten (:func:`rewrite`); a file
    at the name that this run did not write (an earlier run's, a user's) is
    archived first, never overwritten; otherwise :func:`write_new`. Before
    each write, free space is checked against the family's previous size.

    ``catalogue`` holds the store's committed checkpoints and its place
    (directory, storage, durability); ``check_free_space`` says whether a
    write is refused when space is short.
    """

    def __init__(self, catalogue: Catalogue, *, check_free_space: bool) -> None:
        self.catalogue = catalogue
        self.place = catalogue.place
        self.check_free_space = check_free_space
        self.written: set[str] = set()
        #: What every record this committer writes says of its origin.
        self.provenance: Provenance | None = None
        self._input: Mapping[str, Any] | None = None

    def describe_origin(
        self, provenance: Provenance, training_input: Mapping[str, Any] | None = None
    ) -> None:
        """What every record says of where it came from (rule 51).

        ``training_input`` is kept in ``D/inputs/`` before the first record,
        once per distinct digest (:func:`~dp_ckpt_plugin.checkpoint.provenance.write_input`);
        its digest goes into ``provenance``.
        """
        if training_input is not None:
            try:
                digest = input_digest(training_input)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"the training input must hold JSON values only: {exc}"
                ) from None
            provenance = dataclasses.replace(provenance, input=digest)
        provenance.check()
        self.provenance = provenance
        self._input = training_input
        if training_input is not None and not input_fits(training_input):
            log.warning(
                "the training input is larger than %d bytes: its digest is "
                "recorded, the input itself is not kept",
                MAX_INPUT_BYTES,
            )
            self._input = None

    def check_saves(self, step: int, paths, format: str, metrics):
        """The records' ``check_saves``, with this run's provenance."""
        return check_saves(step, paths, format, metrics, self.provenance)

    def commit(
        self,
        path: Path,
        serialize: Callable[[BinaryIO], object],
        *,
        step: int,
        family: Family,
        format: str,
        metrics: Mapping[str, float] | None,
        lineage: Lineage | None = None,
        overlap: bool = True,
    ) -> CommitRecord:
        """Write and commit ``path``; return its record (carrying ``lineage``).

        ``overlap``: whether a first save overlaps its fsyncs (:func:`write_new`);
        off for a background save.
        """
        place = self.place
        self._check_space(family, path)
        if self._input is not None:  # kept once, before the first record names it
            try:
                write_input(
                    place.directory,
                    self._input,
                    storage=place.storage,
                    durable=place.durable,
                )
            except CheckpointWriteError as exc:  # the checkpoint matters more
                log.warning("the training input is not kept: %s", exc)
            self._input = None
        details = {
            "step": step,
            "family": family.prefix,
            "format": format,
            "durable": place.durable,
            "storage": place.storage,
            "metrics": metrics,
            "provenance": self.provenance,
            "lineage": lineage,
        }
        if place.storage.entry(path) is not None:
            old = read_record_or_none(path, storage=place.storage)
            if old is not None and path.name in self.written:
                return rewrite(path, serialize, old=old, **details)
            # an earlier run's checkpoint, or a file that is not ours: keep it
            earlier = Checkpoint(path, step, family.prefix, old)
            dest = archive(
                place.directory, [earlier], storage=place.storage, durable=place.durable
            )
            self.catalogue.discard(family, path.name)
            log.info("moved %s, written before this run, to %s", path, dest)
        # publication, next, fsyncs the directory after the pointer and alias
        # moved: the payload's name is made durable with them
        record = write_new(path, serialize, **details, sync_name=False, overlap=overlap)
        self.written.add(path.name)
        return record

    def _check_space(self, family: Family, path: Path) -> None:
        newest = self.catalogue.newest(family) if self.check_free_space else None
        if newest is None:
            return
        free = self.place.storage.free_bytes(self.place.directory)
        if free is not None and free < int(newest.record.size * SPACE_HEADROOM):
            raise CheckpointWriteError(
                f"could not write {path}: not enough space ({free} bytes free, "
                f"the previous checkpoint took {newest.record.size})"
            )


def serializer(hooks, format: str, step: int, state) -> Callable[[BinaryIO], object]:
    """What writes ``state``: the format's ``on_save_step``, or, for a snapshot
    in shared memory, the writer process (it has ``write_in_process``)."""
    if hasattr(state, "write_in_process"):
        return state
    return functools.partial(hooks.save_step, format, step, state)


def write_new(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    durable: bool,
    storage: Storage,
    sync_name: bool = True,
    overlap: bool = True,
    **fields: Any,
) -> CommitRecord:
    """Write and commit the first checkpoint of a step at ``path`` (absent).

    ``fields`` are the record's (``step``, ``family``, ``format``,
    ``metrics``, ``provenance``, ``lineage``), as ``make_record`` takes them.

    The payload is written and fsynced under a temporary name and hashed;
    its record is written (durably) before the payload gets its name, so no
    crash can leave a full-size numbered file without a record: a crash
    leaves at most a record naming no file, which the next open sweeps.
    Without ``sync_name`` the directory is not fsynced after the payload's
    move: the caller does it (the store's publication fsyncs ``D`` after
    moving the pointer and alias, one fsync for the three names).

    Durable, through a storage that can (``write_payload`` with
    ``meanwhile``, ``sync_file``), the three fsyncs before the payload's
    move overlap (``_record_beside``): the payload's runs from the end
    of its write while the record is written and moved onto its name, then
    the record's data and ``D`` are fsynced at once; the payload is moved
    onto its name only once all three returned. Until then the payload has
    no name, so whatever part of the record's write a crash keeps (an empty
    record, one not yet named) names no file and is swept. Without
    ``overlap`` the three run one after the other on this thread.
    """
    beside = durable and overlap and _overlaps(serialize, storage)
    if beside:
        tmp, record = _recorded_payload(path, serialize, storage, fields)
    else:
        tmp, record = _described_payload(path, serialize, durable, storage, **fields)
    try:
        if not beside:
            write_record(path, record, durable=durable, storage=storage)
        storage.move_into_place(tmp, path, durable=durable and sync_name)
    except (OSError, CheckpointWriteError) as exc:
        # nothing of this step may stay: the temporary file, the record, and
        # a payload whose name might not survive (its directory fsync failed)
        _undo(exc, path, (tmp, path, record_path(path)), storage)
    return record


def _overlaps(serialize, storage: Storage) -> bool:
    """Whether a first save can overlap its fsyncs (see :func:`write_new`)."""
    return not hasattr(serialize, "write_in_process") and hasattr(storage, "sync_file")


def _recorded_payload(
    path: Path, serialize: Callable[[BinaryIO], object], storage: Storage, fields: dict
) -> tuple[Path, CommitRecord]:
    """Write the payload of ``path`` durably and its record beside its fsync.

    Returns the temporary path and the record, already durable under its
    name (:func:`_record_beside`); on failure the record is removed (the
    storage removes the temporary file).
    """
    made: dict = {}
    beside = functools.partial(_record_beside, path, storage, fields, made)
    try:
        tmp, _ = storage.write_payload(
            path, serialize, durable=True, digest=digest_of_view, meanwhile=beside
        )
    except (OSError, CheckpointWriteError) as exc:
        _undo(exc, path, (record_path(path),), storage)
    return tmp, made["record"]


def _record_beside(
    path: Path, storage: Storage, fields: dict, made: dict, tmp: Path, digest: str
) -> None:
    """Write the record of ``path`` (payload at ``tmp``) while the payload's fsync runs.

    The record is written under a temporary name and moved onto its own
    name at once, then its data and the directory are fsynced together (on
    two threads: neither needs the other first, the payload being unnamed).
    """
    record = make_record(tmp, name=path.name, digest=digest, storage=storage, **fields)
    made["record"] = record
    target = write_record(path, record, durable=False, storage=storage)
    at_once(
        lambda: storage.sync_file(target),
        lambda: storage.sync_dir(path.parent, holding=[target]),
    )


def rewrite(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    old: CommitRecord,
    durable: bool,
    storage: Storage,
    **fields: Any,
) -> CommitRecord:
    """Re-save a step whose committed checkpoint (``old``) is at ``path``.

    ``fields`` are the record's, as :func:`write_new` takes them.
    """
    tmp, new = _described_payload(path, serialize, durable, storage, **fields)
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
