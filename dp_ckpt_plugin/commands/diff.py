"""``dp-ckpt diff A B``: what differs between two checkpoints, or a checkpoint and an input.

``A`` and ``B`` are each a checkpoint file, a store directory (its latest
checkpoint, resolved as ``--restart latest`` would, moving nothing) or a
training input file (``*.json``). Three parts:

- **input**: the training inputs key by key (dotted keys,
  ``training.numb_steps``): a checkpoint's is the one its record names
  (deepmd-kit's normalized form, kept in its store); against an input file,
  only the keys that file gives are compared (the others take deepmd-kit's
  defaults, which this command does not compute);
- **provenance**: field by field (versions, backend, world size, seed,
  host, input digest, data systems);
- **tensors** (two checkpoints): every array of the payloads by key path:
  shapes, the largest absolute difference and the relative norm of the
  difference (``|B - A| / |A|``); values that are not arrays compared for
  equality.

Each checkpoint is read once and checked against its record's size before
it is loaded through its format. Read-only. ``--json`` is documented in
``docs/command.md``; the exit status is 0 whatever differs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.provenance import ABSENT, flatten, input_changes, value_text
from ..checkpoint.records import CommitRecord, check_payload, read_record
from ..errors import CheckpointError, InvalidRecordError, UnreadableFileError
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..storage import default_storage
from ..text import shown
from . import UsageError, is_remote, output
from .origins import FIELDS, input_of, private, read_input_file

HELP = "what differs between two checkpoints (or a checkpoint and an input)"
DESCRIPTION = (
    "Compare two checkpoints (files, or store directories: their latest), or a "
    "checkpoint and a training input file: the inputs key by key, the "
    "provenance, and every tensor (shape, largest absolute difference, "
    "relative norm). Read-only."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``diff``."""
    for name in ("a", "b"):
        parser.add_argument(
            name,
            metavar=name.upper(),
            help="a checkpoint file, a store directory (its latest) or an input (.json)",
        )


@dataclass
class Side:
    """One thing compared: a checkpoint (with its record) or an input file."""

    kind: str
    path: Path
    record: CommitRecord | None = None
    config: dict[str, Any] | None = None
    payload: Any = None

    def as_json(self) -> dict[str, Any]:
        record = self.record
        return {
            "kind": self.kind,
            "path": str(self.path),
            "step": record and record.step,
            "format": record and record.format,
            "digest": record and record.digest,
            "provenance": record is not None and record.provenance is not None,
            "input": self.config is not None,
        }


def side_of(value: str) -> Side:
    """Read one side of the comparison (a checkpoint is loaded)."""
    if is_remote(value):
        raise UsageError(f"{value}: diff compares local files and stores")
    storage = default_storage()
    path = Path(value)
    with UsageError.on(UnreadableFileError):
        entry = storage.entry(path, follow=True)
    if entry is None:
        raise UsageError(f"{value}: no such file or directory")
    if entry.is_dir:
        from .directory_view import DirectoryView

        path = Path(DirectoryView(path).resolve("latest", digest=False).item.where)
    elif path.suffix == ".json":
        return Side("input", path.absolute(), config=read_input_file(path, storage))
    path = storage.real(path.absolute())
    with UsageError.on(
        InvalidRecordError, UnreadableFileError, OSError, prefix=f"{value}: "
    ):
        record = read_record(path, storage=storage)
        payload = storage.read_payload(path)
    hooks = Hooks(get_plugin_manager())
    if record is not None:
        check_payload(payload, record, digest=False)
    fmt = record.format if record is not None else hooks.format_of_file(path)
    if fmt is None:
        raise UsageError(f"{value} is neither a checkpoint of a known format nor .json")
    try:
        state = hooks.load_step(fmt, path, payload.reader())
    except Exception as exc:  # whatever a format raises on a broken file
        raise CheckpointError(f"{value} does not load: {exc}") from None
    config = input_of(path, record, storage)
    return Side("checkpoint", path, record, config, state)


def run(args: argparse.Namespace) -> int:
    """Compare and print; exit status 0 whatever differs."""
    found = compare(side_of(args.a), side_of(args.b))
    if args.json:
        output.print_json(found)
    else:
        show(found)
    return 0


def compare(a: Side, b: Side) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "a": a.as_json(),
        "b": b.as_json(),
        "input": _inputs(a, b),
        "provenance": _provenance(a, b),
        "tensors": _tensors(a, b),
    }


def _inputs(a: Side, b: Side) -> dict[str, Any]:
    if a.config is None or b.config is None:
        note = f"{(a if a.config is None else b).path} keeps no training input"
        return {"compared": None, "note": note, "changes": []}
    left, right = a.config, b.config
    compared = "all keys"
    given = [s for s in (a, b) if s.kind == "input"]
    if len(given) == 1:
        keys = {k for k in flatten(given[0].config) if not private(k)}
        left = {k: v for k, v in flatten(left).items() if k in keys}
        right = {k: v for k, v in flatten(right).items() if k in keys}
        compared = "the keys the input file gives"
    changes = [
        {
            "key": key,
            "a": None if old is ABSENT else old,
            "b": None if new is ABSENT else new,
            "in_a": old is not ABSENT,
            "in_b": new is not ABSENT,
        }
        for key, old, new in input_changes(left, right)
    ]
    return {"compared": compared, "note": None, "changes": changes}


def _provenance(a: Side, b: Side) -> dict[str, Any]:
    pa, pb = (s.record and s.record.provenance for s in (a, b))
    if pa is None or pb is None:
        return {"compared": False, "changes": []}
    da, db = pa.to_dict(), pb.to_dict()
    changes = [
        {"field": key, "a": da[key], "b": db[key]}
        for key in (*FIELDS, "data")
        if da[key] != db[key]
    ]
    return {"compared": True, "changes": changes}


def _leaves(value: Any, where: str = "") -> dict[str, Any]:
    if not isinstance(value, dict | list | tuple):
        return {where or "/": value}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return {
        path: leaf
        for key, item in items
        for path, leaf in _leaves(item, f"{where}/{key}").items()
    }


def _array(value: Any):
    """``value`` as a NumPy array of float64, or ``None`` when it is no array."""
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        if value.is_floating_point() or value.is_complex():
            value = value.double()
        value = value.numpy()
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return None
    return value.astype(np.float64)


#: What a tensor entry measures (``None`` where it does not apply).
_MEASURES = ("shape_a", "shape_b", "max_abs_diff", "rel_norm")


def _tensors(a: Side, b: Side) -> dict[str, Any]:
    if a.kind != "checkpoint" or b.kind != "checkpoint":
        return {"compared": False, "count": 0, "changed": 0, "entries": []}
    import numpy as np

    left, right = _leaves(a.payload), _leaves(b.payload)
    entries = []
    for key in sorted(set(left) | set(right)):
        entry = {"key": key, "status": "same", **dict.fromkeys(_MEASURES)}
        entries.append(entry)
        if key not in left or key not in right:
            entry["status"] = "only_b" if key not in left else "only_a"
            continue
        x, y = _array(left[key]), _array(right[key])
        if x is None or y is None:
            if x is not None or y is not None or not _equal(left[key], right[key]):
                entry["status"] = "changed"
            continue
        entry["shape_a"], entry["shape_b"] = list(x.shape), list(y.shape)
        if x.shape != y.shape:
            entry["status"] = "shape"
            continue
        diff = y - x
        biggest = float(np.max(np.abs(diff))) if diff.size else 0.0
        norm = float(np.linalg.norm(x))
        entry["max_abs_diff"] = biggest if math.isfinite(biggest) else None
        if norm > 0:
            rel = float(np.linalg.norm(diff)) / norm
            entry["rel_norm"] = rel if math.isfinite(rel) else None
        elif biggest == 0:
            entry["rel_norm"] = 0.0
        if biggest != 0 or not np.array_equal(x, y, equal_nan=True):
            entry["status"] = "changed"
    changed = sum(e["status"] != "same" for e in entries)
    return {
        "compared": True,
        "count": len(entries),
        "changed": changed,
        "entries": entries,
    }


def _equal(x: Any, y: Any) -> bool:
    try:
        return bool(x == y)
    except Exception:  # an object whose == is not a truth value
        return repr(x) == repr(y)


def show(found: dict[str, Any]) -> None:
    """Print for people."""
    out = output.console()
    for name in ("a", "b"):
        side = found[name]
        step = f" (step {side['step']})" if side["step"] is not None else ""
        out.print(f"{name.upper()}  {side['kind']} {shown(side['path'])}{step}")
    inputs = found["input"]
    if inputs["compared"] is None:
        out.print(f"input: not compared: {shown(inputs['note'])}")
    elif not inputs["changes"]:
        out.print(f"input: the same ({inputs['compared']})")
    else:
        out.print(
            f"input: {len(inputs['changes'])} key(s) differ ({inputs['compared']})"
        )
        for c in inputs["changes"]:
            old = value_text(c["a"] if c["in_a"] else ABSENT)
            new = value_text(c["b"] if c["in_b"] else ABSENT)
            out.print(f"  {shown(c['key'])}  {shown(old)} -> {shown(new)}")
    prov = found["provenance"]
    if not prov["compared"]:
        out.print("provenance: not compared (a side records none)")
    elif not prov["changes"]:
        out.print("provenance: the same")
    else:
        out.print(f"provenance: {len(prov['changes'])} field(s) differ")
        for c in prov["changes"]:
            old, new = value_text(c["a"]), value_text(c["b"])
            out.print(f"  {c['field']}  {shown(old)} -> {shown(new)}")
    tensors = found["tensors"]
    if not tensors["compared"]:
        return
    out.print(f"tensors: {tensors['changed']} of {tensors['count']} differ")
    table = output.table(None, ["key", "status", "shape", "max |B-A|", "|B-A|/|A|"])
    for e in tensors["entries"]:
        if e["status"] == "same":
            continue
        shape = "-" if e["shape_a"] is None else str(tuple(e["shape_a"]))
        if e["status"] == "shape":
            shape = f"{tuple(e['shape_a'])} -> {tuple(e['shape_b'])}"
        measured = (e[k] for k in ("max_abs_diff", "rel_norm"))
        numbers = ("-" if n is None else f"{n:.3g}" for n in measured)
        table.add_row(shown(e["key"]), e["status"], shape, *numbers)
    out.print(table)
