"""``dp-ckpt show D [SPEC]``: the checkpoint a restart would use, and how it was found.

The same as ``dp-ckpt resolve SPEC --dir D`` (:mod:`.resolve`), kept as an alias.

``SPEC`` is what ``--restart`` takes: ``latest`` (the default), ``best``, a
directory, a file or a prefix; it resolves through the same front door as a
training restart (:func:`~dp_ckpt_plugin.resolution.resolve_restart`, with
installed resolver plugins), with ``D`` as the store. Nothing is moved: a
corrupt candidate is skipped and reported, never quarantined. Its
provenance (versions, backend, world size, seed, host, input digest, data
systems) is shown, and with ``--input`` the training input it was trained
with (``--json`` always holds both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import RestartNotFoundError
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..resolution import ResolveContext, Resolved, resolve_restart
from . import UsageError, add_digest_flag, one_line, output, store_directory
from .inventory import read_inventory
from .origins import input_of, input_text, provenance_json, provenance_rows

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
    parser.add_argument(
        "--input",
        dest="with_input",
        action="store_true",
        help="also print the training input the checkpoint was trained with",
    )


def run(args: argparse.Namespace) -> int:
    """Resolve and show; exit status 1 when nothing is found."""
    found = resolve_in(args.directory, args.spec, digest=args.digest)
    if getattr(args, "path_only", False):
        if args.json:
            raise UsageError("--path and --json do not go together: choose one")
        for warning in found.warnings:
            sys.stderr.write(f"dp-ckpt: warning: {one_line(warning)}\n")
        sys.stdout.write(f"{found.path}\n")
        return 0
    if args.json:
        output.print_json(as_json(found, args.spec))
        return 0
    return show_found(found, with_input=getattr(args, "with_input", False))


def show_found(found: Resolved, *, with_input: bool) -> int:
    """Print a resolved checkpoint for people: record, provenance, input."""
    out = output.console()
    c = found.checkpoint
    record = c.record
    rows = [
        ("checkpoint", str(c.path)),
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
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}")
    for warning in found.warnings:
        out.print(f"warning: {warning}")
    if with_input:
        config = input_of(c.path, record)
        if config is None:
            out.print("input: not kept (the record names none, or its file is gone)")
        else:
            out.print("input:")
            for line in input_text(config).splitlines():
                out.print(line)
    return 0


def resolve_in(directory: Path, spec: str, *, digest: bool) -> Resolved:
    """Resolve ``spec`` with ``directory`` as the store, moving nothing."""
    inventory = read_inventory(directory)
    if not inventory.families:
        raise RestartNotFoundError(
            f"no checkpoint found for restart {spec!r}: {inventory.directory} holds "
            "no checkpoint family (no commit record, manifest or pointer)"
        )
    context = ResolveContext(
        family=inventory.families[0].family,
        store_dir=inventory.directory,
        cwd=Path.cwd(),
        digest=digest,
        quarantine=False,
    )
    return resolve_restart(Hooks(get_plugin_manager()), spec, context)


def as_json(found: Resolved, spec: str) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    c = found.checkpoint
    record = c.record
    return {
        "spec": spec,
        "path": str(c.path),
        "name": c.name,
        "step": c.step,
        "family": c.family,
        "how": found.how,
        "checked": found.checked,
        "committed": record is not None,
        "size": record.size if record else None,
        "created": (record.created or None) if record else None,
        "format": record.format if record else None,
        "metrics": record.metrics if record else None,
        "warnings": list(found.warnings),
        "provenance": provenance_json(record.provenance if record else None),
        "input": input_of(c.path, record),
    }
