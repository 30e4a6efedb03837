"""``dp-ckpt inspect PATH``: what one checkpoint holds.

Its step, format, size and the state of its commit record (and, with
``--digest``, of its digest), then the structure of its payload: every key
path with its type, shape, dtype and size in bytes, down to ``--depth``
levels (how many levels lie below is said). Tensors that share storage (views,
tied weights) are counted once in the payload's total, as the file holds them
once. The payload is read through the ``on_load_step`` hook of its format:
the one its commit record names, else the registered format whose suffix the
file has. The file is opened once and read once: the record is checked
against those bytes, and the format reads the same bytes. Nothing heavy is
imported unless the format needs it (torch only for a torch checkpoint).
A checkpoint of a store on object storage (its URL, or the store's for
its latest) is fetched first, verified, into a cache (``commands.views``);
``--json`` then names it in ``url`` (``null`` for a file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..checkpoint.layout import step_in_name
from ..checkpoint.records import CommitRecord, check_payload, read_record
from ..errors import CheckpointError, InvalidRecordError, UnreadableFileError
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..storage import Storage, default_storage
from ..store.adoption import why_not
from ..text import MAX_LOG_LINE, shown
from . import FAILURE, UsageError, add_digest_flag, at_least, is_remote, output
from .open_store import locate

HELP = "show what one checkpoint holds: step, format, record, payload structure"
DESCRIPTION = (
    "Read one checkpoint file through its format's on_load_step hook and show "
    "its step, format, size, the state of its commit record, and every key "
    "path of its payload with its type, shape, dtype and size in bytes."
)


#: How many levels of the payload are listed unless ``--depth`` says otherwise.
DEFAULT_DEPTH = 6


def _file_or_url(value: str) -> Path | str:
    return value if is_remote(value) else Path(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``inspect``."""
    parser.add_argument(
        "path",
        type=_file_or_url,
        help="a checkpoint file, or its URL in a remote store",
    )
    parser.add_argument(
        "--depth",
        type=at_least(int, 1, "a depth of 1 or more"),
        default=DEFAULT_DEPTH,
        metavar="N",
        help=f"list key paths down to N levels (default {DEFAULT_DEPTH})",
    )
    add_digest_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Inspect; exit status 1 when the file does not load or disagrees with its record."""
    view, spec = locate(args.path)
    path, url, warnings = view.fetch(spec)
    for warning in warnings:
        sys.stderr.write(f"dp-ckpt: warning: {shown(warning, MAX_LOG_LINE)}\n")
    found = inspect_file(path, digest=args.digest, depth=args.depth)
    found["url"] = url
    if args.json:
        output.print_json(found)
    else:
        if url is not None:
            output.console().print(f"{url} (fetched into {path})")
        show(found)
    return 0 if found["loaded"] and found["record"] in {"ok", "none"} else FAILURE


def inspect_file(
    path: Path,
    *,
    digest: bool,
    depth: int = DEFAULT_DEPTH,
    storage: Storage | None = None,
) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    storage = storage or default_storage()
    path = storage.real(Path(path).absolute())
    with UsageError.on(UnreadableFileError):
        found = storage.entry(path)
    if found is None:
        raise UsageError(f"{path}: no such file")
    if not found.is_file:
        raise UsageError(f"{path} is not a file (inspect takes one checkpoint)")
    with UsageError.on(OSError, UnreadableFileError, prefix=f"{path}: "):
        payload = storage.read_payload(path)  # the one reading of its bytes
    record: CommitRecord | None = None
    state, problem = "none", None
    try:
        record = read_record(path, storage=storage)
    except InvalidRecordError as exc:
        state, problem = "malformed", str(exc)
    if record is not None:
        try:
            check_payload(payload, record, digest=digest)
            state = "ok"
        except CheckpointError as exc:
            state, problem = "mismatch", str(exc)
    hooks = Hooks(get_plugin_manager())
    fmt = record.format if record is not None else _format_by_suffix(hooks, path)
    step = record.step if record is not None else step_in_name(path.name)
    walk = Walk(depth)
    error = None
    try:
        walk.describe(hooks.load_step(fmt, path, payload.reader()), "", 0)
    except Exception as exc:  # whatever a format raises on a broken file
        error = why_not(exc)
    return {
        "path": str(path),
        "name": path.name,
        "step": step,
        "family": record.family if record is not None else None,
        "format": fmt,
        "size": payload.size,
        "record": state,
        "record_problem": problem,
        "digest": record.digest if record is not None else None,
        "digest_checked": bool(digest and state == "ok"),
        "created": (record.created or None) if record is not None else None,
        "metrics": record.metrics if record is not None else None,
        "loaded": error is None,
        "load_error": error,
        "payload_bytes": walk.payload_bytes,
        "depth": depth,
        "levels_cut": max(walk.deepest - depth, 0),
        "entries": walk.entries,
    }


def _format_by_suffix(hooks: Hooks, path: Path) -> str:
    name = hooks.format_of_file(path)
    if name is not None:
        return name
    known = ", ".join(f"{n} ({i.suffix})" for n, i in sorted(hooks.formats().items()))
    raise UsageError(
        f"{path.name} has no commit record and no suffix of a known format "
        f"(formats: {known or 'none'})"
    )


class Walk:
    """The entries of a payload, down to ``depth`` levels, and its total bytes.

    Every leaf is visited (the total and the depth below the limit count
    all of them); entries are kept down to ``depth`` levels. A storage
    shared by several tensors (a view, tied weights) counts once in
    :attr:`payload_bytes`; each tensor still shows its own bytes, and a
    tensor sharing an earlier one's storage names it in ``shares``.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.entries: list[dict[str, Any]] = []
        self.deepest = 0
        self.payload_bytes = 0
        self._storages: dict[Any, str] = {}

    def describe(self, value: Any, where: str, level: int) -> None:
        """Visit ``value`` at key path ``where``, ``level`` levels down."""
        self.deepest = max(self.deepest, level)
        shown = level <= self.depth
        if isinstance(value, dict | list | tuple):
            kind = "dict" if isinstance(value, dict) else type(value).__name__
            if shown:
                self.entries.append(
                    _entry(where or "/", kind, leaf=False, length=len(value))
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                self.describe(item, f"{where}/{key}", level + 1)
            return
        entry = _leaf(value, where or "/")
        storage = _storage_of(value)
        if storage is None:
            self.payload_bytes += entry["bytes"] or 0
        elif storage[0] in self._storages:
            entry["shares"] = self._storages[storage[0]]
        else:
            self._storages[storage[0]] = entry["key"]
            self.payload_bytes += storage[1]
        if shown:
            self.entries.append(entry)


def _storage_of(value: Any) -> tuple[Any, int] | None:
    """The memory a tensor or array lives in (identity, bytes), if it has one."""
    untyped = getattr(value, "untyped_storage", None)
    if callable(untyped) and hasattr(value, "element_size"):  # a torch tensor
        found = untyped()
        return ("torch", found.data_ptr(), found.nbytes()), int(found.nbytes())
    base = value
    while getattr(base, "base", None) is not None:  # a NumPy view
        base = base.base
    if base is not value and hasattr(base, "nbytes"):
        return ("numpy", id(base)), int(base.nbytes)
    return None


def _leaf(value: Any, where: str) -> dict[str, Any]:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    kind = kind.removeprefix("builtins.")
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        sized = isinstance(value, str | bytes | bytearray)
        return _entry(where, kind, bytes=len(value) if sized else None)
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a tensor
        nbytes = int(value.numel()) * int(value.element_size())
        dtype = str(dtype).removeprefix("torch.")
    else:
        nbytes = int(getattr(value, "nbytes", 0))
    shape = [int(n) for n in shape]
    return _entry(where, kind, shape=shape, dtype=str(dtype), bytes=nbytes)


def _entry(where: str, kind: str, **found: Any) -> dict[str, Any]:
    """One entry of ``--json``: what is not ``found`` is ``None`` (a leaf)."""
    blank = dict.fromkeys(("shape", "dtype", "bytes", "length"))
    return {"key": where, "type": kind, **blank, "leaf": True, "shares": None, **found}


def show(found: dict[str, Any]) -> None:
    """Print for people."""
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
    if found["levels_cut"]:
        cut = (
            f"{found['levels_cut']} deeper level(s) not listed (--depth N to see them)"
        )
        rows.append(("listed", f"{found['depth']} level(s); {cut}"))
    out = output.console()
    output.fields(rows, out)
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
        nbytes = "-" if e["bytes"] is None else str(e["bytes"])
        if e["shares"]:
            nbytes += f" (storage of {e['shares']})"
        table.add_row(e["key"], e["type"], shape, e["dtype"] or "-", nbytes)
    out.print(table)
