"""``dp-ckpt verify PATH``: check checkpoints against their commit records.

``PATH`` is a store directory (every committed checkpoint of every family is
checked, and every pointer and alias must name one) or one checkpoint file.
Each file's size and content are compared with its record: it is re-read
and hashed with the algorithm the record names, through
:func:`dp_ckpt_plugin.checkpoint.records.verify`. ``--size-only`` is the quick check
(sizes alone); ``--digest`` names the default, for
scripts written when the size was. The summary says how many bytes were
hashed and at what rate; above :data:`PROGRESS_ABOVE` bytes to hash, a
progress bar on standard error (on a terminal only: ``--json`` output stays
clean). Read-only: a corrupt file is reported, never moved.

Exit status 0 when everything checked is sound, 1 when a checkpoint does not
match its record, a record is malformed, a pointer or alias names no
committed checkpoint, or there was nothing to check. A store a run is
writing may be verified: a checkpoint that retention removed meanwhile is
listed as gone, not as a problem.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, records
from ..checkpoint.pointers import named_by
from ..errors import CorruptCheckpointError, InvalidRecordError, UnreadableFileError
from ..storage import default_storage
from . import output, refuse_sha256
from .inventory import Inventory, read_inventory

HELP = "check checkpoints against their commit records"
DESCRIPTION = (
    "Check every committed checkpoint of a store directory (or one checkpoint "
    "file) against its commit record: its size and its content (re-read and "
    "hashed; --size-only compares sizes alone). Exit status 1 when anything "
    "does not match. Read-only."
)
#: Bytes to hash from which a progress bar is shown (on a terminal only).
PROGRESS_ABOVE = 256 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``verify``."""
    parser.add_argument(
        "path", type=_existing, help="a store directory, or one checkpoint file"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--size-only",
        dest="digest",
        action="store_false",
        help="compare sizes only, without reading the files (the quick check)",
    )
    refuse_sha256(parser)
    what.add_argument(
        "--digest",
        dest="digest",
        action="store_true",
        help="re-read each file and compare its digest too (the default)",
    )
    parser.set_defaults(digest=True)


def _existing(value: str) -> Path | str:
    from . import is_remote

    if is_remote(value):
        return value  # a remote store, read when the command runs
    path = Path(value)
    try:
        found = default_storage().entry(path, follow=True)
    except UnreadableFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if found is None:
        raise argparse.ArgumentTypeError(f"{value}: no such file or directory")
    if not (found.is_dir or found.is_file):
        raise argparse.ArgumentTypeError(f"{value} is not a file or a directory")
    return path


@dataclass
class Check:
    """The outcome for one checkpoint."""

    checkpoint: Checkpoint
    problem: str = ""
    gone: bool = False
    #: Bytes read and hashed (0 when only the size was compared).
    hashed: int = 0

    @property
    def ok(self) -> bool:
        """Whether it matches its record (or went away cleanly)."""
        return not self.problem


def check(checkpoint: Checkpoint, *, digest: bool) -> Check:
    """Check one committed checkpoint against its record.

    A checkpoint that is no longer there (retention removed it meanwhile) is
    ``gone``, not a problem. With ``digest``, the size is compared first and
    the file is read only when it matches (:attr:`Check.hashed`).
    """
    hashed = 0
    try:
        records.verify(checkpoint.path, checkpoint.record, digest=False)
        if digest:
            hashed = checkpoint.record.size
            records.verify(checkpoint.path, checkpoint.record, digest=True)
    except FileNotFoundError:
        return Check(checkpoint, gone=True)
    except CorruptCheckpointError as exc:
        if default_storage().entry(checkpoint.path) is None:
            return Check(checkpoint, gone=True)
        return Check(checkpoint, str(exc), hashed=hashed)
    return Check(checkpoint, hashed=hashed)


#: How often a store whose listed files all went before their records were
#: read is listed again (retention of a run saving meanwhile).
_RELISTINGS = 5


def run(args: argparse.Namespace) -> int:
    """Check; exit status 1 on any problem."""
    if default_storage().entry(args.path, follow=True).is_dir:
        inventory = read_inventory(args.path)
        for _ in range(_RELISTINGS):  # a live store moved on under the listing
            if inventory.checkpoints() or not inventory.vanished:
                break
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
    start = time.perf_counter()
    results = _check_all(checkpoints, digest=args.digest, quiet=args.json)
    rate = Rate(sum(r.hashed for r in results), time.perf_counter() - start)
    problems += [r.problem for r in results if not r.ok]
    gone = [r for r in results if r.gone]
    results = [r for r in results if not r.gone]
    if not results and not problems and not gone:
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
            as_json(args.path, results, problems, unverified, args.digest, gone, rate)
        )
    else:
        show(results, problems, unverified, digest=args.digest, gone=gone, rate=rate)
    return 1 if problems else 0


def _one_file(path: Path) -> tuple[list[Checkpoint], list[str]]:
    try:
        record = records.read_record(Path(path).absolute())
    except InvalidRecordError as exc:
        return [], [str(exc)]
    if record is None:
        return [], [
            f"{path} has no commit record (written without dp_ckpt_plugin?); "
            "it cannot be verified"
        ]
    return [Checkpoint(Path(path).absolute(), record.step, record.family, record)], []


def link_problems(inventory: Inventory) -> list[str]:
    """Pointers and aliases that name a file that is not there.

    What they name is read again when a file is missing: a run that moved
    them on and removed the old checkpoint meanwhile is not a problem.
    """
    storage = default_storage()
    problems = []
    for view in inventory.families:
        for kind, named, where in (
            ("pointer", view.pointer, view.family.pointer),
            ("alias", view.alias, view.family.alias),
        ):
            if named is None or _is_file(inventory.directory / named):
                continue
            now = named_by(inventory.directory, view.family, storage=storage)[kind]
            if now is not None and now != named and _is_file(inventory.directory / now):
                continue
            problems.append(
                f"{kind} {inventory.directory / where} names {named}, "
                "which does not exist"
            )
    return problems


def _is_file(path: Path) -> bool:
    try:
        found = default_storage().entry(path, follow=True)
    except UnreadableFileError:
        return False
    return found is not None and found.is_file


def _check_all(
    checkpoints: list[Checkpoint], *, digest: bool, quiet: bool
) -> list[Check]:
    """Check each checkpoint, with a progress bar when there is much to hash.

    The bar goes to standard error, and only on a terminal, from
    :data:`PROGRESS_ABOVE` bytes to hash on: ``--json`` output stays clean.
    """
    total = sum(c.record.size for c in checkpoints)
    if not shows_progress(total, digest=digest, quiet=quiet):
        return [check(c, digest=digest) for c in checkpoints]
    from rich.progress import Progress

    results = []
    bar = output.console(stderr=True).console  # rich's own, on the terminal
    with Progress(console=bar, transient=True) as progress:
        task = progress.add_task("hashing", total=total)
        for c in checkpoints:
            results.append(check(c, digest=digest))
            progress.advance(task, c.record.size)
    return results


def shows_progress(total: int, *, digest: bool, quiet: bool) -> bool:
    """Whether checking ``total`` bytes shows a progress bar (see :func:`_check_all`)."""
    import sys

    return digest and not quiet and total >= PROGRESS_ABOVE and sys.stderr.isatty()


@dataclass(frozen=True)
class Rate:
    """How many bytes were hashed, in how many seconds."""

    hashed: int
    seconds: float

    def __str__(self) -> str:
        per_second = self.hashed / self.seconds if self.seconds > 0 else 0
        return (
            f"hashed {output.size(self.hashed)} in {self.seconds:.2f} s "
            f"({output.size(int(per_second))}/s)"
        )


def show(
    results: list[Check],
    problems: list[str],
    unverified: list[Path],
    *,
    digest: bool,
    gone: list[Check] = (),
    rate: Rate | None = None,
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
    for r in gone:
        out.print(f"gone: {r.checkpoint.name} was removed meanwhile (retention)")
    for problem in problems:
        out.print(f"problem: {problem}")
    bad = len(problems)
    good = sum(r.ok for r in results)
    done = f"{good} of {len(results)} checkpoint(s) sound ({checked}); {bad} problem(s)"
    if not digest:
        done += "; content not read (--size-only)"
    elif rate is not None:
        done += f"; {rate}"
    out.print(done)


def as_json(
    path: Path,
    results: list[Check],
    problems: list[str],
    unverified: list[Path],
    digest: bool,
    gone: list[Check] = (),
    rate: Rate | None = None,
) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "path": str(Path(path).absolute()),
        "checked": "digest" if digest else "size",
        "ok": not problems,
        "hashed_bytes": rate.hashed if rate else 0,
        "seconds": round(rate.seconds, 3) if rate else 0.0,
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
        "gone": [str(r.checkpoint.path) for r in gone],
        "problems": problems,
    }
