"""What the commands say of a checkpoint's origin: its provenance and input.

Shared by ``show``, ``diff`` and ``check`` (not a subcommand). The input is
the one the checkpoint's record names by digest, kept in its store's
``inputs/`` folder (:mod:`dp_ckpt_plugin.checkpoint.provenance`); a record
without provenance (written before it existed, or adopted) has neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint.limits import MAX_INPUT_BYTES
from ..checkpoint.provenance import Provenance, read_input
from ..checkpoint.records import CommitRecord, load_json
from ..errors import InvalidRecordError, UnreadableFileError
from ..storage import Storage, default_storage
from ..text import shown
from . import UsageError

#: The provenance fields, in the order shown.
FIELDS = (
    "plugin",
    "deepmd_kit",
    "torch",
    "python",
    "backend",
    "world_size",
    "seed",
    "host",
    "input",
)


def input_of(
    path: Path, record: CommitRecord | None, storage: Storage | None = None
) -> dict[str, Any] | None:
    """The training input the checkpoint at ``path`` was trained with, if kept."""
    provenance = record.provenance if record is not None else None
    if provenance is None or provenance.input is None:
        return None
    storage = storage or default_storage()
    return read_input(Path(path).parent, provenance.input, storage=storage)


def provenance_rows(provenance: Provenance | None) -> list[tuple[str, str]]:
    """``(field, value)`` rows for people."""
    if provenance is None:
        return [("provenance", "none (the record predates it, or was adopted)")]
    rows = []
    for key in FIELDS:
        value = getattr(provenance, key)
        rows.append((key.replace("_", "-"), "-" if value is None else shown(value)))
    data = provenance.data
    if data is not None:
        rows.append(("data", f"{data.count} system(s), {data.digest}"))
        rows += [
            (f"  {s.role}", f"{shown(s.path)} ({s.fingerprint[:19]}…)")
            for s in data.systems
        ]
    return rows


def read_input_file(path: Path, storage: Storage | None = None) -> dict[str, Any]:
    """A training input file (JSON) read strictly; one line of error otherwise."""
    storage = storage or default_storage()
    with UsageError.on(UnreadableFileError):
        data = storage.read_small(path, MAX_INPUT_BYTES)
    if data is None:
        raise UsageError(f"{path}: no such file")
    not_input = f"{path} is not a JSON training input"
    with UsageError.on(UnicodeDecodeError, InvalidRecordError, prefix=f"{not_input}: "):
        value = load_json(data.decode("utf-8"), path, "training input")
    if not isinstance(value, dict):
        raise UsageError(f"{not_input} (not an object)")
    return value


def private(key: str) -> bool:
    """Whether a dotted input key is private (a part starts with ``_``)."""
    return any(part.startswith("_") for part in key.split("."))
