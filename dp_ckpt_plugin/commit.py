"""The write transaction: a durable payload, then its commit record.

:func:`write_payload` has a format serialize the payload into a temporary
name beside its final one, fsyncs it, moves it into place and fsyncs the
directory. :func:`commit` then writes the commit record, last and atomically:
only now does the checkpoint count. Each step cleans up after itself on
failure, so the previous committed checkpoint is left as it was (rule 8).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from . import fsio
from .catalogue import read_record_or_none
from .errors import CheckpointWriteError
from .records import CommitRecord, make_record, record_path, write_record


def write_payload(
    path: Path, serialize: Callable[[BinaryIO], object], *, durable: bool
) -> bool:
    """Write a payload atomically at ``path``; return whether it replaced one.

    Re-saving a step (deepmd-kit does after ``change_bias_after_training``)
    drops the old record just before the move; if the move then fails, the
    old record is put back. A payload that reached its name but whose
    directory fsync failed is removed, unless it replaced an older one.
    """
    previous = _file_id(path)
    old_record = read_record_or_none(path) if previous else None
    try:
        fsio.write_file_atomic(
            path,
            serialize,
            durable=durable,
            before_replace=lambda: _uncommit(path),
        )
    except CheckpointWriteError:
        current = _file_id(path)
        if current is not None and current != previous:
            if previous is None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        elif old_record is not None and not record_path(path).exists():
            with contextlib.suppress(OSError):
                write_record(path, old_record, durable=durable)
        raise
    return previous is not None


def commit(
    path: Path, *, step: int, family: str, format: str, replaces: bool, durable: bool
) -> CommitRecord:
    """Write the commit record of a durable payload, last.

    On failure the record (if its directory fsync was what failed) and a new
    payload are removed; a payload that replaced an older one stays, since a
    pointer may name it.
    """
    try:
        record = make_record(path, step=step, family=family, format=format)
        write_record(path, record, durable=durable)
    except (OSError, CheckpointWriteError) as exc:
        leftovers = (record_path(path),) if replaces else (record_path(path), path)
        for leftover in leftovers:
            with contextlib.suppress(OSError):
                fsio.remove_file(leftover)
        if isinstance(exc, CheckpointWriteError):
            raise
        raise CheckpointWriteError(
            f"could not commit {path}: {exc.strerror or exc}"
        ) from exc
    return record


def _uncommit(path: Path) -> None:
    """Drop the record of a checkpoint about to be overwritten (same step)."""
    rec = record_path(path)
    if rec.exists():
        fsio.remove_file(rec)


def _file_id(path: Path) -> tuple[int, int] | None:
    """Return the device and inode of ``path``, or ``None`` if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
