"""``dp-ckpt ls D``: every checkpoint of a store, and what keeps it.

For each family: its committed checkpoints (step, size, time, metrics) and,
for each, what keeps it: the pointer or alias naming it, and the retention
policies (from the store's manifest) that keep it. A checkpoint no policy
keeps goes at the next save; one whose size on disk is not its record's is
shown as cut short. A family without checkpoints (the EMA family of a run
without EMA) is one line, its table only with ``--all``. Then the numbered
files that are not committed, what lies in ``quarantine/``, and the archives
of earlier runs with their sizes and their total.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..retention import Verdict, ranking_of
from . import output, select_families, store_directory
from .inventory import FamilyView, Inventory, read_inventory

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
    parser.add_argument(
        "--all",
        action="store_true",
        help="also list every file in quarantine/ and archive/, and the "
        "tables of families without checkpoints",
    )


def run(args: argparse.Namespace) -> int:
    """List; exit status 0."""
    inventory = read_inventory(args.directory)
    families = select_families(inventory, args.family)
    if args.json:
        output.print_json(as_json(inventory, families))
    else:
        show(inventory, families, everything=args.all)
    return 0


def verdicts(view: FamilyView) -> dict[str, Verdict]:
    """What keeps each checkpoint of ``view``, by name (protections alone when
    the policy is unknown)."""
    if view.policy is not None:
        found = view.explain(view.policy, protect_newest=True)
        return {v.name: v for v in found}
    protected = view.protections()
    return {
        c.name: Verdict(
            c.name,
            c.step,
            (("protected", protected[c.name]),) if c.name in protected else (),
        )
        for c in view.checkpoints
    }


def describe_kept(verdict: Verdict | None, policy_known: bool) -> str:
    """``kept by`` for people."""
    if verdict is None or not verdict.kept:
        if not policy_known:
            return "? (policy unknown)"
        return GOES
    return "; ".join(reason for _, reason in verdict.kept_by)


def show(inventory: Inventory, families: list[FamilyView], *, everything: bool) -> None:
    """Print the tables."""
    out = output.console()
    fmt = inventory.format or "unknown format"
    out.print(f"{inventory.directory}  ({fmt})")
    for warning in inventory.warnings:
        out.print(f"warning: {warning}")
    if not inventory.families:
        out.print(
            "no checkpoint families found (no commit record, manifest or pointer)"
        )
    for view in families:
        policy = view.reason or "unknown (no manifest)"
        title = f"{view.family.prefix}  kept by: {policy}"
        if not view.checkpoints and not everything:
            out.print(f"{title}: no committed checkpoints")
            continue
        rows = output.table(
            title,
            ["step", "file", "size", "saved (UTC)", "metrics", "kept by"],
            right=("step", "size"),
        )
        found = verdicts(view)
        ranking = ranking_of(view.policy) if view.policy is not None else None
        for c in view.checkpoints:
            shown = c.record.metrics or {}
            if ranking is not None:  # the one that ranks (--json has them all)
                shown = {k: v for k, v in shown.items() if k == ranking.metric}
            kept = describe_kept(found.get(c.name), view.policy is not None)
            size = output.size(c.record.size)
            if view.torn(c):
                size = f"{output.size(view.on_disk[c.name])} of {size}"
                kept = f"CUT SHORT (its record says {c.record.size} bytes); {kept}"
            rows.add_row(
                str(c.step),
                c.name,
                size,
                output.utc(c.record.created),
                output.metrics(shown),
                kept,
            )
        out.print(rows)
    strays = [
        s for s in inventory.strays if s.family in {f.family.prefix for f in families}
    ]
    if strays:
        rows = output.table(
            "not committed (never restarted from, never pruned)", ["file", "why"]
        )
        for stray in strays:
            rows.add_row(stray.path.name, stray.problem)
        out.print(rows)
    if inventory.quarantined:
        out.print(
            f"quarantine/: {len(inventory.quarantined)} file(s) moved aside as corrupt"
        )
        if everything:
            for path in inventory.quarantined:
                out.print(f"  {path.name}  {output.size(_size(path))}")
    if inventory.archives:
        show_archives(out, inventory.archives, everything=everything)


def show_archives(out, archives, *, everything: bool) -> None:
    """The archives of earlier runs: one row each, then the total."""
    count = sum(len(a.checkpoints) for a in archives)
    total = sum(a.size for a in archives)
    rows = output.table(
        f"archive/: {len(archives)} earlier run(s), {count} checkpoint(s), "
        f"{output.size(total)} in all",
        ["folder", "checkpoints", "size", "made (UTC)"],
        right=("checkpoints", "size"),
    )
    for a in archives:
        rows.add_row(
            a.name, str(len(a.checkpoints)), output.size(a.size), output.utc(a.created)
        )
    out.print(rows)
    if everything:
        for a in archives:
            out.print(f"  {a.name}: {', '.join(a.checkpoints) or '(empty)'}")


def as_json(inventory: Inventory, families: list[FamilyView]) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    prefixes = {f.family.prefix for f in families}
    return {
        "directory": str(inventory.directory),
        "format": inventory.format,
        "manifest": inventory.manifest is not None,
        "families": [family_json(view) for view in families],
        "uncommitted": [
            {
                "name": s.path.name,
                "path": str(s.path),
                "family": s.family,
                "step": s.step,
                "problem": s.problem,
            }
            for s in inventory.strays
            if s.family in prefixes
        ],
        "quarantine": [
            {"name": p.name, "path": str(p), "size": _size(p)}
            for p in inventory.quarantined
        ],
        "archive": [
            {
                "folder": a.name,
                "path": str(a.path),
                "checkpoints": a.checkpoints,
                "size": a.size,
                "created": a.created,
            }
            for a in inventory.archives
        ],
        "archive_size": sum(a.size for a in inventory.archives),
        "warnings": inventory.warnings,
    }


def family_json(view: FamilyView) -> dict[str, Any]:
    """One family of the ``--json`` form."""
    found = verdicts(view)
    known = view.policy is not None
    checkpoints = []
    for c in view.checkpoints:
        verdict = found.get(c.name)
        kept_by = verdict.kept_by if verdict else ()
        checkpoints.append(
            {
                "name": c.name,
                "path": str(c.path),
                "step": c.step,
                "size": c.record.size,
                "size_on_disk": view.on_disk.get(c.name),
                "torn": view.torn(c),
                "created": c.record.created or None,
                "format": c.record.format,
                "metrics": c.record.metrics,
                "kept": bool(kept_by) if known else (True if kept_by else None),
                "kept_by": [{"policy": p, "reason": r} for p, r in kept_by],
            }
        )
    return {
        "prefix": view.family.prefix,
        "suffix": view.family.suffix,
        "pointer": view.family.pointer,
        "latest": view.pointer,
        "alias": view.alias,
        "policy": view_policy(view),
        "reason": view.reason,
        "checkpoints": checkpoints,
    }


def view_policy(view: FamilyView) -> dict[str, Any] | None:
    """The family's policy as plain keys, or ``None`` when unknown."""
    from ..retention import policy_to_dict

    return policy_to_dict(view.policy) if view.policy is not None else None


def _size(path) -> int | None:
    from ..errors import UnreadableFileError
    from ..storage import default_storage

    try:
        found = default_storage().entry(path, follow=True)
    except UnreadableFileError:
        return None
    return found.size if found is not None else None
