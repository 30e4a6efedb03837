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

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, NoReturn

from . import fsio
from .digests import HashingWriter
from .errors import CheckpointWriteError
from .records import CommitRecord, make_record, record_path, write_record


def write_new(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    step: int,
    family: str,
    format: str,
    durable: bool,
    metrics: Mapping[str, float] | None = None,
) -> CommitRecord:
    """Write and commit the first checkpoint of a step at ``path`` (absent).

    The payload is written and fsynced under a temporary name and hashed;
    its record is written (durably) before the payload gets its name, so no
    crash can leave a full-size numbered file without a record: a crash
    leaves at most a record naming no file, which the next open sweeps.
    """
    tmp, record = _described_payload(
        path,
        serialize,
        durable,
        step=step,
        family=family,
        format=format,
        metrics=metrics,
    )
    try:
        write_record(path, record, durable=durable)
        fsio.move_into_place(tmp, path, durable=durable)
    except (OSError, CheckpointWriteError) as exc:
        # nothing of this step may stay: the temporary file, the record, and
        # a payload whose name might not survive (its directory fsync failed)
        _undo(exc, path, (tmp, path, record_path(path)))
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
    metrics: Mapping[str, float] | None = None,
) -> CommitRecord:
    """Re-save a step whose committed checkpoint (``old``) is at ``path``."""
    tmp, new = _described_payload(
        path,
        serialize,
        durable,
        step=step,
        family=family,
        format=format,
        metrics=metrics,
    )
    try:
        both = dataclasses.replace(new, replaces=(old.size, old.digest))
        write_record(path, both, durable=durable)
    except (OSError, CheckpointWriteError) as exc:
        _undo(exc, path, (tmp,))
    # from here on the double record stands whatever fails: it accepts the
    # old payload (the move failed) and the new one (the move happened)
    fsio.move_into_place(tmp, path, durable=durable)
    write_record(path, new, durable=durable)
    return new


def _described_payload(
    path: Path, serialize: Callable[[BinaryIO], object], durable: bool, **fields
) -> tuple[Path, CommitRecord]:
    """Write the payload of ``path`` to a temporary file and describe it.

    Returns the temporary path and the record for ``path`` (``fields``: step,
    family, format, metrics); on failure the temporary file is removed.
    """
    tmp, digest = write_hashed(path, serialize, durable=durable)
    try:
        return tmp, make_record(tmp, name=path.name, digest=digest, **fields)
    except OSError as exc:
        _undo(exc, path, (tmp,))


def _undo(exc: OSError, path: Path, leftovers: tuple[Path, ...]) -> NoReturn:
    """Remove ``leftovers`` of a failed commit of ``path``; raise the error."""
    for leftover in leftovers:
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    if isinstance(exc, CheckpointWriteError):
        raise exc
    raise CheckpointWriteError(
        f"could not commit {path}: {exc.strerror or exc}"
    ) from exc


def write_hashed(
    path: Path, serialize: Callable[[BinaryIO], object], *, durable: bool
) -> tuple[Path, str | None]:
    """Write a payload to a temporary file beside ``path``, hashing it on the way.

    Returns the temporary path and its digest, or ``None`` when the format
    did not write sequentially (the file is then hashed once it is written).
    """
    found: dict[str, str | None] = {}

    def writer(handle):
        hashing = HashingWriter(handle)
        try:
            serialize(hashing)
        finally:
            found["digest"] = hashing.digest()

    tmp = fsio.write_temp(path, writer, durable=durable)
    return tmp, found.get("digest")


def remove(paths: list[Path], *, durable: bool) -> None:
    """Remove committed checkpoints (retention): payloads, then records.

    The payloads' removal is made durable before any record goes: a crash in
    between leaves small records that name no file (the next open sweeps
    them), never a full-size payload without a record that no rule would
    remove.
    """
    for path in paths:
        fsio.remove_file(path)
    if paths and durable:
        fsio.fsync_dir(paths[0].parent)
    for path in paths:
        fsio.remove_file(record_path(path))
    if paths and durable:
        fsio.fsync_dir(paths[0].parent)
