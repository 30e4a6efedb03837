"""``dp-ckpt show D [SPEC]``: the checkpoint a restart would use, and how it was found.

The same as ``dp-ckpt resolve SPEC --dir D`` (:mod:`.resolve`), kept as an alias.

``SPEC`` is what ``--restart`` takes: ``latest`` (the default), ``best``, a
directory, a file or a prefix; it resolves through the same front door as a
training restart (:func:`~dp_ckpt_plugin.resolution.resolve_restart`, with
installed resolver plugins), with ``D`` as the store; a store on object
storage is read through its HEAD, its payload not downloaded
(``commands.views``). Nothing is moved: a corrupt candidate is skipped and
reported, never quarantined. Its provenance (versions, backend, world
size, seed, host, input digest, data systems) is shown, and with
``--input`` the training input it was trained with (``--json`` always holds
both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..text import MAX_LOG_LINE, shown
from . import (
    UsageError,
    add_digest_flag,
    flag,
    is_remote,
    one_line,
    output,
    store_directory,
)
from .open_store import locate, open_view
from .origins import provenance_rows
from .views import Resolution, StoreView

HELP = "the checkpoint a restart would use (resolve, with the store first)"
DESCRIPTION = (
    "Resolve a restart specification (latest, best, a directory, a file or a "
    "prefix) against a store directory as --restart would, and show the "
    "checkpoint found, how it was found, how it was checked and where it came "
    "from (its provenance; --input: the training input). Read-only."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``show``."""
    parser.add_argument("directory", type=store_directory, help="the store (save_dir)")
    parser.add_argument(
        "spec",
        nargs="?",
        default="latest",
        help="latest (default), best, best:DIR, a directory, a file or a prefix",
    )
    add_digest_flag(parser)
    flag(
        parser,
        "--input",
        "also print the training input the checkpoint was trained with",
        dest="with_input",
    )


def run(args: argparse.Namespace) -> int:
    """Resolve and show; exit status 1 when nothing is found."""
    view, spec = store_of(args.directory, args.spec)
    found = view.resolve(spec, digest=args.digest)
    if getattr(args, "path_only", False):
        if args.json:
            raise UsageError("--path and --json do not go together: choose one")
        for warning in found.warnings:
            sys.stderr.write(
                f"dp-ckpt: warning: {shown(one_line(warning), MAX_LOG_LINE)}\n"
            )
        sys.stdout.write(f"{shown(found.item.where, MAX_LOG_LINE)}\n")
        return 0
    if args.json:
        output.print_json(as_json(found, args.spec))
        return 0
    return show_found(found, with_input=getattr(args, "with_input", False))


def store_of(directory: Path | str, spec: str) -> tuple[StoreView, str]:
    """The store to resolve ``spec`` in: ``directory``, unless ``spec`` is the
    URL of a checkpoint or store (then the store above it)."""
    if not is_remote(directory) and is_remote(spec):
        return locate(spec)
    return open_view(directory), spec


def show_found(found: Resolution, *, with_input: bool) -> int:
    """Print a resolved checkpoint for people: record, provenance, input."""
    c = found.item
    record = found.record
    rows = [
        ("checkpoint", c.where),
        ("step", str(c.step)),
        ("family", c.family or "-"),
        ("found by", found.how),
        ("checked", found.checked),
    ]
    if record is not None:
        rows += [
            ("size", output.size(record.size)),
            ("saved (UTC)", output.utc(record.created)),
            ("format", record.format),
        ]
        if record.metrics:
            rows.append(("metrics", output.metrics(record.metrics)))
        rows += provenance_rows(record.provenance)
    out = output.console()
    output.fields(rows, out)
    for warning in found.warnings:
        out.print(f"warning: {warning}")
    if with_input:
        if found.input is None:
            out.print("input: not kept (the record names none, or its file is gone)")
        else:
            out.print("input:")
            for line in json.dumps(found.input, indent=2, sort_keys=True).splitlines():
                out.print(line)
    return 0


def as_json(found: Resolution, spec: str) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    c = found.item
    record = found.record
    return {
        "spec": spec,
        "path": c.where,
        "name": c.name,
        "step": c.step,
        "family": c.family,
        "how": found.how,
        "checked": found.checked,
        "fell_back": found.fell_back,
        "committed": record is not None,
        "size": record.size if record else None,
        "digest": record.digest if record else None,
        "created": (record.created or None) if record else None,
        "format": record.format if record else None,
        "metrics": record.metrics if record else None,
        "warnings": list(found.warnings),
        "provenance": record.provenance.to_dict()
        if record and record.provenance
        else None,
        "input": found.input,
    }
