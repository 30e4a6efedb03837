"""``dp-ckpt verify PATH``: check checkpoints against their commit records.

``PATH`` is a store directory or the URL of a store on object storage (every
committed checkpoint of every family is checked, and every pointer and alias
must name one; see ``commands.views``) or one checkpoint file.
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
import sys
import time
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, records
from ..errors import InvalidRecordError
from ..storage import default_storage
from . import existing, flag, is_remote, output, refuse_sha256
from .inventory import listed
from .open_store import locate, open_view
from .views import Aside, Check, Listed, StoreView

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
    flag(what, "--digest", "re-read each file and compare its digest too (the default)")
    parser.set_defaults(digest=True)


def _existing(value: str) -> Path | str:
    # a remote store is read when the command runs
    return value if is_remote(value) else existing(value, Path(value), files=True)


#: How often a store whose listed files all went before their records were
#: read is listed again (retention of a run saving meanwhile).
_RELISTINGS = 5


def run(args: argparse.Namespace) -> int:
    """Check; exit status 1 on any problem."""
    unverified: list[Aside] = []
    if is_remote(args.path) or default_storage().entry(args.path, follow=True).is_dir:
        view = open_view(args.path)
        listing = view.listing()
        for _ in range(_RELISTINGS):  # a live store moved on under the listing
            if listing.items() or not listing.vanished:
                break
            listing = view.listing()
        items, where = listing.items(), listing.where
        problems = view.pointer_problems(listing)
        for stray in listing.strays:
            if stray.problem == "no commit record":
                unverified.append(stray)
            else:
                problems.append(f"{stray.where}: {stray.problem}")
    else:
        view, name = locate(args.path)
        items, problems = _one_file(Path(view.where) / name)
        where = str(Path(args.path).absolute())
    start = time.perf_counter()
    results = _check_all(view, items, digest=args.digest, quiet=args.json)
    seconds = time.perf_counter() - start
    problems += [r.problem for r in results if not r.ok]
    gone = [r for r in results if r.gone]
    results = [r for r in results if not r.gone]
    if not results and not problems and not gone:
        without = f" ({len(unverified)} file(s) without a commit record)"
        problems.append(
            f"nothing to verify: {args.path} holds no committed checkpoint"
            + (without if unverified else "")
        )
    found = {
        "path": where,
        "checked": "digest" if args.digest else "size",
        "ok": not problems,
        "sound": sum(r.ok for r in results),
        "hashed_bytes": sum(r.hashed for r in results),
        "seconds": round(seconds, 3),
        "checkpoints": [
            {
                "name": r.item.name,
                "path": r.item.where,
                "family": r.item.family,
                "step": r.item.step,
                "size": r.item.size,
                "ok": r.ok,
                "problem": r.problem,
            }
            for r in results
        ],
        "unverified": [s.where for s in unverified],
        "gone": [r.item.where for r in gone],
        "problems": problems,
    }
    if args.json:
        output.print_json(found)
    else:
        show(found, seconds)
    return 1 if problems else 0


def _one_file(path: Path) -> tuple[list[Listed], list[str]]:
    try:
        record = records.read_record(path)
    except InvalidRecordError as exc:
        return [], [str(exc)]
    if record is None:
        return [], [
            f"{path} has no commit record (written without dp_ckpt_plugin?); "
            "it cannot be verified"
        ]
    return [listed(Checkpoint(path, record.step, record.family, record))], []


def _check_all(
    view: StoreView, items: list[Listed], *, digest: bool, quiet: bool
) -> list[Check]:
    """Check each checkpoint, with a progress bar when there is much to hash.

    The bar goes to standard error, and only on a terminal, from
    :data:`PROGRESS_ABOVE` bytes to hash on: ``--json`` output stays clean.
    """
    total = sum(c.size for c in items)
    if not digest or quiet or total < PROGRESS_ABOVE or not sys.stderr.isatty():
        return [view.check(c, digest=digest) for c in items]
    from rich.progress import Progress

    results = []
    bar = output.console(stderr=True).console  # rich's own, on the terminal
    with Progress(console=bar, transient=True) as progress:
        task = progress.add_task("hashing", total=total)
        for c in items:
            results.append(view.check(c, digest=digest))
            progress.advance(task, c.size)
    return results


def show(found: dict[str, Any], seconds: float) -> None:
    """Print the ``--json`` form for people: the table, then the problems.

    A file without a record, or gone, is named by its file name; the rate
    is of the ``seconds`` measured, not of their rounded value.
    """
    out = output.console()
    digest = found["checked"] == "digest"
    checked = "size, digest" if digest else "size"
    rows = output.table(
        None, ["file", "step", "size", "checked", "result"], right=("step", "size")
    )
    for c in found["checkpoints"]:
        result = "ok" if c["ok"] else "CORRUPT"
        rows.add_row(c["name"], str(c["step"]), output.size(c["size"]), checked, result)
    if found["checkpoints"]:
        out.print(rows)
    for where in found["unverified"]:
        out.print(f"not verified: {Path(where).name} has no commit record")
    for where in found["gone"]:
        out.print(f"gone: {Path(where).name} was removed meanwhile (retention)")
    for problem in found["problems"]:
        out.print(f"problem: {problem}")
    done = (
        f"{found['sound']} of {len(found['checkpoints'])} checkpoint(s) sound "
        f"({checked}); {len(found['problems'])} problem(s)"
    )
    hashed = found["hashed_bytes"]
    per_second = hashed / seconds if seconds > 0 else 0
    rate = (
        f"hashed {output.size(hashed)} in {seconds:.2f} s "
        f"({output.size(int(per_second))}/s)"
    )
    out.print(f"{done}; {rate if digest else 'content not read (--size-only)'}")
