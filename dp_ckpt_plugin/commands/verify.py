"""``dp-ckpt verify PATH``: check checkpoints against their commit records.

``PATH`` is a store directory (every committed checkpoint of every family is
checked, and every pointer and alias must name one) or one checkpoint file.
The size is always compared with the record; ``--digest`` (alias
``--sha256``) re-reads each file and compares its digest too, through
:func:`dp_ckpt_plugin.records.verify`, which follows what each record says.
Read-only: a corrupt file is reported, never moved.

Exit status 0 when everything checked is sound, 1 when a checkpoint does not
match its record, a record is malformed, a pointer or alias names no
committed checkpoint, or there was nothing to check.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import records
from ..checkpoint import Checkpoint
from ..errors import CorruptCheckpointError, InvalidRecordError
from . import add_digest_flag, output
from .inventory import Inventory, read_inventory

HELP = "check checkpoints against their commit records"
DESCRIPTION = (
    "Check every committed checkpoint of a store directory (or one checkpoint "
    "file) against its commit record: its size, and with --digest its "
    "content. Exit status 1 when anything does not match. Read-only."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``verify``."""
    parser.add_argument(
        "path", type=_existing, help="a store directory, or one checkpoint file"
    )
    add_digest_flag(parser)


def _existing(value: str) -> Path:
    path = Path(value)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{value}: no such file or directory")
    return path


@dataclass
class Check:
    """The outcome for one checkpoint."""

    checkpoint: Checkpoint
    problem: str = ""

    @property
    def ok(self) -> bool:
        """Whether it matches its record."""
        return not self.problem


def check(checkpoint: Checkpoint, *, digest: bool) -> Check:
    """Check one committed checkpoint against its record."""
    try:
        records.verify(checkpoint.path, checkpoint.record, digest=digest)
    except CorruptCheckpointError as exc:
        return Check(checkpoint, str(exc))
    return Check(checkpoint)


def run(args: argparse.Namespace) -> int:
    """Check; exit status 1 on any problem."""
    if args.path.is_dir():
        inventory = read_inventory(args.path)
        checkpoints = inventory.checkpoints()
        problems = link_problems(inventory) + [
            f"{s.path}: {s.problem}"
            for s in inventory.strays
            if s.problem != "no commit record"
        ]
        unverified = [
            s.path for s in inventory.strays if s.problem == "no commit record"
        ]
    else:
        checkpoints, problems = _one_file(args.path)
        unverified = []
    results = _check_all(checkpoints, digest=args.digest, quiet=args.json)
    problems += [r.problem for r in results if not r.ok]
    if not results and not problems:
        problems.append(
            f"nothing to verify: {args.path} holds no committed checkpoint"
            + (
                f" ({len(unverified)} file(s) without a commit record)"
                if unverified
                else ""
            )
        )
    if args.json:
        output.print_json(
            as_json(args.path, results, problems, unverified, args.digest)
        )
    else:
        show(results, problems, unverified, digest=args.digest)
    return 1 if problems else 0


def _one_file(path: Path) -> tuple[list[Checkpoint], list[str]]:
    try:
        record = records.read_record(path)
    except InvalidRecordError as exc:
        return [], [str(exc)]
    if record is None:
        return [], [
            f"{path} has no commit record (written without dp_ckpt_plugin?); "
            "it cannot be verified"
        ]
    return [Checkpoint(Path(path).absolute(), record.step, record.family, record)], []


def link_problems(inventory: Inventory) -> list[str]:
    """Pointers and aliases that name a file that is not there."""
    problems = []
    for view in inventory.families:
        for kind, named, where in (
            ("pointer", view.pointer, view.family.pointer),
            ("alias", view.alias, view.family.alias),
        ):
            if named is not None and not (inventory.directory / named).is_file():
                problems.append(
                    f"{kind} {inventory.directory / where} names {named}, "
                    "which does not exist"
                )
    return problems


def _check_all(
    checkpoints: list[Checkpoint], *, digest: bool, quiet: bool
) -> list[Check]:
    """Check each checkpoint, with a progress bar on a terminal when hashing."""
    import sys

    if not (digest and not quiet and sys.stderr.isatty() and checkpoints):
        return [check(c, digest=digest) for c in checkpoints]
    from rich.progress import Progress

    results = []
    total = sum(c.record.size for c in checkpoints)
    with Progress(console=output.console(stderr=True), transient=True) as progress:
        task = progress.add_task("hashing", total=total)
        for c in checkpoints:
            results.append(check(c, digest=digest))
            progress.advance(task, c.record.size)
    return results


def show(
    results: list[Check], problems: list[str], unverified: list[Path], *, digest: bool
) -> None:
    """Print the table and the problems."""
    out = output.console()
    checked = "size, digest" if digest else "size"
    rows = output.table(
        None, ["file", "step", "size", "checked", "result"], right=("step", "size")
    )
    for r in results:
        c = r.checkpoint
        rows.add_row(
            c.name,
            str(c.step),
            output.size(c.record.size),
            checked,
            "ok" if r.ok else "CORRUPT",
        )
    if results:
        out.print(rows)
    for path in unverified:
        out.print(f"not verified: {path.name} has no commit record")
    for problem in problems:
        out.print(f"problem: {problem}")
    bad = len(problems)
    good = sum(r.ok for r in results)
    out.print(
        f"{good} of {len(results)} checkpoint(s) sound ({checked}); {bad} problem(s)"
    )


def as_json(
    path: Path,
    results: list[Check],
    problems: list[str],
    unverified: list[Path],
    digest: bool,
) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "path": str(Path(path).absolute()),
        "checked": "digest" if digest else "size",
        "ok": not problems,
        "checkpoints": [
            {
                "name": r.checkpoint.name,
                "path": str(r.checkpoint.path),
                "family": r.checkpoint.family,
                "step": r.checkpoint.step,
                "size": r.checkpoint.record.size,
                "ok": r.ok,
                "problem": r.problem,
            }
            for r in results
        ],
        "unverified": [str(p) for p in unverified],
        "problems": problems,
    }
