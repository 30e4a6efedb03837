"""``dp-ckpt ls D``: every checkpoint of a store, and what keeps it.

For each family: its committed checkpoints (step, size, time, metrics) and,
for each, what keeps it: the pointer or alias naming it, and the retention
policies (from the store's manifest) that keep it. A checkpoint no policy
keeps goes at the next save; one whose size on disk is not its record's is
shown as cut short. A family without checkpoints (the EMA family of a run
without EMA) is one line, its table only with ``--all``. Then the numbered
files that are not committed, what lies in ``quarantine/``, and the archives
of earlier runs with their sizes and their total. A store on object storage
(``commands.views``) also says its HEAD's sequence and epoch and who holds
its writer lease.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from ..retention import policy_to_dict, ranking_of
from ..store.archive import ArchiveFolder
from . import flag, output, store_directory
from .open_store import open_view
from .views import Aside, Listing, Shelf

HELP = "list checkpoints and what keeps each"
DESCRIPTION = (
    "List the checkpoints of a store directory, family by family, with what "
    "keeps each: the pointer or alias naming it and the retention policies "
    "(recorded in the store's manifest) that keep it; then the files that "
    "are not committed, quarantined ones and archived runs."
)
#: What ``kept_by`` says of a checkpoint no policy keeps.
GOES = "goes at the next save"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ls``."""
    parser.add_argument("directory", type=store_directory, help="the store (save_dir)")
    parser.add_argument(
        "--family", metavar="PREFIX", help="only this family (such as model.ckpt)"
    )
    flag(
        parser,
        "--all",
        "also list every file in quarantine/ and archive/, and the "
        "tables of families without checkpoints",
    )


def run(args: argparse.Namespace) -> int:
    """List; exit status 0."""
    listing = open_view(args.directory).listing(args.family)
    if args.json:
        output.print_json(as_json(listing))
    else:
        show(listing, everything=args.all)
    return 0


def keepers(shelf: Shelf) -> dict[str, tuple[tuple[str, str], ...]]:
    """What keeps each checkpoint of ``shelf`` (policy, reason), by name: its
    protections alone when the policy is unknown."""
    if shelf.policy is not None:
        return {v.name: v.kept_by for v in shelf.explain(shelf.policy)}
    return {name: (("protected", why),) for name, why in shelf.protections().items()}


def show(listing: Listing, *, everything: bool) -> None:
    """Print the tables."""
    out = output.console()
    fmt = listing.format or "unknown format"
    out.print(f"{listing.where}  ({fmt})")
    if listing.head is not None:
        lease, holder = listing.lease, "not held"
        if lease and not lease.released:
            holder = f"held by {lease.holder.describe()} (epoch {lease.epoch})"
        out.print(
            f"HEAD seq {listing.head.seq}, epoch {listing.head.epoch}; lease {holder}"
        )
    for warning in listing.warnings:
        out.print(f"warning: {warning}")
    if not listing.families:
        out.print(
            "no checkpoint families found (no commit record, manifest or pointer)"
        )
    for shelf in listing.families:
        policy = shelf.reason or "unknown (no manifest)"
        title = f"{shelf.prefix}  kept by: {policy}"
        if not shelf.items and not everything:
            out.print(f"{title}: no committed checkpoints")
            continue
        rows = output.table(
            title,
            ["step", "file", "size", "saved (UTC)", "metrics", "kept by"],
            right=("step", "size"),
        )
        ranking = ranking_of(shelf.policy) if shelf.policy is not None else None
        for c in family_json(shelf)["checkpoints"]:  # drawn from the --json form
            metrics = c["metrics"] or {}
            if ranking is not None:  # the one that ranks (--json has them all)
                metrics = {k: v for k, v in metrics.items() if k == ranking.metric}
            kept = "; ".join(k["reason"] for k in c["kept_by"])
            if not c["kept_by"]:
                kept = GOES if shelf.policy is not None else "? (policy unknown)"
            size = output.size(c["size"])
            if c["torn"]:
                size = f"{output.size(c['size_on_disk'])} of {size}"
                kept = f"CUT SHORT (its record says {c['size']} bytes); {kept}"
            name = f"{c['name']}  <- latest" if c["published"] else c["name"]
            cells = (str(c["step"]), name, size, output.utc(c["created"]))
            rows.add_row(*cells, output.metrics(metrics), kept)
        out.print(rows)
    prefixes = {f.prefix for f in listing.families}
    strays = [s for s in listing.strays if s.family in prefixes]
    if strays:
        rows = output.table(
            "not committed (never restarted from, never pruned)", ["file", "why"]
        )
        for stray in strays:
            rows.add_row(stray.name, stray.problem)
        out.print(rows)
    if listing.quarantined:
        out.print(
            f"quarantine/: {len(listing.quarantined)} file(s) moved aside as corrupt"
        )
        if everything:
            for q in listing.quarantined:
                out.print(f"  {q.name}  {output.size(q.size)}")
    if listing.archives:
        show_archives(out, listing.archives, everything=everything)


def show_archives(out, archives: list[Aside], *, everything: bool) -> None:
    """The archives of earlier runs: one row each, then the total (those of a
    store on object storage, named by HEAD but not read, one line each)."""
    for a in archives:
        if a.size is None:
            out.print(f"archive: {a.where}")
    archives = [a for a in archives if a.size is not None]
    if not archives:
        return
    count = sum(len(a.checkpoints) for a in archives)
    total = sum(a.size or 0 for a in archives)
    rows = output.table(
        f"archive/: {len(archives)} earlier run(s), {count} checkpoint(s), "
        f"{output.size(total)} in all",
        ["folder", "checkpoints", "size", "made (UTC)"],
        right=("checkpoints", "size"),
    )
    for a in archives:
        rows.add_row(*archive_cells(a))
    out.print(rows)
    if everything:
        for a in archives:
            out.print(f"  {a.name}: {', '.join(a.checkpoints) or '(empty)'}")


def archive_cells(archive: Aside | ArchiveFolder) -> tuple[str, str, str, str]:
    """An archive's row: its folder, checkpoints, size and time made."""
    made = output.utc(archive.created)
    return archive.name, str(len(archive.checkpoints)), output.size(archive.size), made


def as_json(listing: Listing) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    prefixes = {f.prefix for f in listing.families}
    head, lease = listing.head, listing.lease
    return {
        "directory": listing.where,
        "format": listing.format,
        "manifest": listing.manifest,
        "head": None
        if head is None
        else {"seq": head.seq, "epoch": head.epoch, "format": head.format},
        "lease": None
        if lease is None
        else {**asdict(lease), "holder": lease.holder.describe()},
        "families": [family_json(shelf) for shelf in listing.families],
        "uncommitted": [
            {
                "name": s.name,
                "path": s.where,
                "family": s.family,
                "step": s.step,
                "problem": s.problem,
            }
            for s in listing.strays
            if s.family in prefixes
        ],
        "quarantine": [
            {"name": q.name, "path": q.where, "size": q.size}
            for q in listing.quarantined
        ],
        "archive": [
            {
                "folder": a.name,
                "path": a.where,
                "checkpoints": list(a.checkpoints),
                "size": a.size,
                "created": a.created,
            }
            for a in listing.archives
        ],
        "archive_size": sum(a.size or 0 for a in listing.archives),
        "warnings": listing.warnings,
    }


def family_json(shelf: Shelf) -> dict[str, Any]:
    """One family of the ``--json`` form."""
    found = keepers(shelf)
    known = shelf.policy is not None
    checkpoints = []
    for c in shelf.items:
        kept_by = found.get(c.name, ())
        checkpoints.append(
            {
                "name": c.name,
                "path": c.where,
                "step": c.step,
                "size": c.size,
                "size_on_disk": c.on_disk,
                "torn": c.torn,
                "created": c.created,
                "format": c.format,
                "digest": c.digest,
                "metrics": None if c.metrics is None else dict(c.metrics),
                "published": c.name == shelf.latest,
                "kept": bool(kept_by) if known else (True if kept_by else None),
                "kept_by": [{"policy": p, "reason": r} for p, r in kept_by],
            }
        )
    return {
        "prefix": shelf.prefix,
        "suffix": shelf.suffix,
        "pointer": shelf.pointer,
        "latest": shelf.latest,
        "alias": shelf.alias,
        "policy": policy_to_dict(shelf.policy) if shelf.policy is not None else None,
        "reason": shelf.reason,
        "checkpoints": checkpoints,
    }
