"""``dp-ckpt inspect PATH``: what one checkpoint holds.

Its step, format, size and the state of its commit record (and, with
``--digest``, of its digest), then the structure of its payload: every key
path with its type, shape, dtype and size in bytes. The payload is read
through the ``on_load_step`` hook of its format: the one its commit record
names, else the registered format whose suffix the file has. Nothing heavy is
imported unless the format needs it (torch only for a torch checkpoint).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..adoption import why_not
from ..errors import CheckpointError, InvalidRecordError, UnreadableFileError
from ..hooks import Hooks
from ..plugins import get_plugin_manager
from ..records import CommitRecord, read_record, verify
from ..storage import default_storage
from . import FAILURE, UsageError, add_digest_flag, output
from .inventory import _NUMBERED

HELP = "show what one checkpoint holds: step, format, record, payload structure"
DESCRIPTION = (
    "Read one checkpoint file through its format's on_load_step hook and show "
    "its step, format, size, the state of its commit record, and every key "
    "path of its payload with its type, shape, dtype and size in bytes."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``inspect``."""
    parser.add_argument("path", type=Path, help="a checkpoint file")
    add_digest_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Inspect; exit status 1 when the file does not load or disagrees with its record."""
    found = inspect_file(args.path, digest=args.digest)
    if args.json:
        output.print_json(found)
    else:
        show(found)
    return 0 if found["loaded"] and found["record"] in {"ok", "none"} else FAILURE


def inspect_file(path: Path, *, digest: bool) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    storage = default_storage()
    path = storage.real(Path(path).absolute())
    try:
        found = storage.entry(path)
    except UnreadableFileError as exc:
        raise UsageError(str(exc)) from None
    if found is None:
        raise UsageError(f"{path}: no such file")
    if not found.is_file:
        raise UsageError(f"{path} is not a file (inspect takes one checkpoint)")
    record: CommitRecord | None = None
    state, problem = "none", None
    try:
        record = read_record(path)
    except InvalidRecordError as exc:
        state, problem = "malformed", str(exc)
    if record is not None:
        try:
            verify(path, record, digest=digest)
            state = "ok"
        except CheckpointError as exc:
            state, problem = "mismatch", str(exc)
    hooks = Hooks(get_plugin_manager())
    fmt = record.format if record is not None else _format_by_suffix(hooks, path)
    match = _NUMBERED.fullmatch(path.name)
    step = (
        record.step if record is not None else (int(match["step"]) if match else None)
    )
    entries: list[dict[str, Any]] = []
    error = None
    try:
        describe(hooks.load_step(fmt, path), "", entries)
    except Exception as exc:  # whatever a format raises on a broken file
        error = why_not(exc)
    return {
        "path": str(path),
        "name": path.name,
        "step": step,
        "family": record.family if record is not None else None,
        "format": fmt,
        "size": found.size,
        "record": state,
        "record_problem": problem,
        "digest": record.digest if record is not None else None,
        "digest_checked": bool(digest and state == "ok"),
        "created": (record.created or None) if record is not None else None,
        "metrics": record.metrics if record is not None else None,
        "loaded": error is None,
        "load_error": error,
        "payload_bytes": sum(e["bytes"] or 0 for e in entries if e["leaf"]),
        "entries": entries,
    }


def _format_by_suffix(hooks: Hooks, path: Path) -> str:
    name = hooks.format_of_file(path)
    if name is not None:
        return name
    formats = hooks.formats()
    known = ", ".join(f"{n} ({i.suffix})" for n, i in sorted(formats.items()))
    raise UsageError(
        f"{path.name} has no commit record and no suffix of a known format "
        f"(formats: {known or 'none'})"
    )


def describe(value: Any, where: str, entries: list[dict[str, Any]]) -> None:
    """Append one entry per key path of ``value`` (containers, then their items)."""
    if isinstance(value, dict):
        entries.append(
            _entry(where or "/", "dict", None, None, None, False, len(value))
        )
        for key, item in value.items():
            describe(item, f"{where}/{key}", entries)
        return
    if isinstance(value, list | tuple):
        kind = type(value).__name__
        entries.append(_entry(where or "/", kind, None, None, None, False, len(value)))
        for i, item in enumerate(value):
            describe(item, f"{where}/{i}", entries)
        return
    entries.append(_leaf(value, where or "/"))


def _leaf(value: Any, where: str) -> dict[str, Any]:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    kind = kind.removeprefix("builtins.")
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        if hasattr(value, "element_size") and hasattr(value, "numel"):  # a tensor
            nbytes = int(value.numel()) * int(value.element_size())
            dtype = str(dtype).removeprefix("torch.")
        else:
            nbytes = int(getattr(value, "nbytes", 0))
            dtype = str(dtype)
        return _entry(where, kind, [int(n) for n in shape], dtype, nbytes, True)
    if isinstance(value, str | bytes | bytearray):
        return _entry(where, kind, None, None, len(value), True)
    return _entry(where, kind, None, None, None, True)


def _entry(where, kind, shape, dtype, nbytes, leaf, length=None) -> dict[str, Any]:
    return {
        "key": where,
        "type": kind,
        "shape": shape,
        "dtype": dtype,
        "bytes": nbytes,
        "length": length,
        "leaf": leaf,
    }


def show(found: dict[str, Any]) -> None:
    """Print for people."""
    out = output.console()
    record = {
        "ok": "ok (size" + (", digest" if found["digest_checked"] else "") + ")",
        "none": "none (not committed)",
    }.get(found["record"], f"{found['record']}: {found['record_problem']}")
    rows = [
        ("checkpoint", found["path"]),
        ("step", "-" if found["step"] is None else str(found["step"])),
        ("format", found["format"]),
        ("size", output.size(found["size"])),
        ("record", record),
    ]
    if found["digest"]:
        rows.append(("digest", found["digest"]))
    if found["metrics"]:
        rows.append(("metrics", output.metrics(found["metrics"])))
    rows.append(("payload", output.size(found["payload_bytes"]) + " in arrays/values"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}")
    if not found["loaded"]:
        out.print(f"does not load: {found['load_error']}")
        return
    table = output.table(
        None, ["key", "type", "shape", "dtype", "bytes"], right=("bytes",)
    )
    for e in found["entries"]:
        if e["shape"] is not None:
            shape = str(tuple(e["shape"]))
        elif e["length"] is not None:
            shape = f"{e['length']} item(s)"
        else:
            shape = "-"
        table.add_row(
            e["key"],
            e["type"],
            shape,
            e["dtype"] or "-",
            "-" if e["bytes"] is None else str(e["bytes"]),
        )
    out.print(table)
