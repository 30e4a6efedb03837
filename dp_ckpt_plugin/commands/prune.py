"""``dp-ckpt prune D``: apply a retention policy to a store now.

The policy of each family is the one the store's manifest records, with the
keys given on the command line (``--keep-last``, ``--keep-every-n-steps``,
``--keep-best``, ``--best-metric``, ``--best-mode``) in place of the recorded
ones. As in a running store, the checkpoints the pointer and alias name and
the newest one are never removed, and each removal takes the payload before
its record. The store's lock is held throughout: a store a run is writing is
refused, naming the run. ``--dry-run`` shows what would go and removes
nothing.

``--archives`` prunes the archives of earlier runs (``D/archive/<UTC>/``)
instead: ``--keep-archives N`` keeps the newest N, ``--older-than DAYS``
removes those made longer ago; given both, an archive goes when either says
so. The same lock, the same ``--dry-run``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..retention import (
    BEST_MODES,
    POLICY_KEYS,
    RetentionPolicy,
    Verdict,
    policy_from_dict,
    policy_to_dict,
    reason_of,
)
from ..storage import local_storage
from ..store.archive import archive_folders, archives_beyond, remove_archive
from ..store.lock import StoreLock
from ..store.pruning import remove
from . import UsageError, output, select_families, store_directory
from .inventory import FamilyView, read_inventory

HELP = "remove what a retention policy does not keep"
DESCRIPTION = (
    "Apply a retention policy to a store directory now: the policy its "
    "manifest records, with the keys given here in place of the recorded "
    "ones. The checkpoints the pointer and alias name, and the newest, are "
    "never removed. Refused while a run holds the store."
)

#: Command-line options are the policy keys (:data:`POLICY_KEYS`): one table.
OPTIONS = POLICY_KEYS


def _count(value: str) -> int | None:
    if value.lower() in ("none", "null"):
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer, got {value!r}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prune``."""
    parser.add_argument("directory", type=store_directory, help="the store (save_dir)")
    parser.add_argument("--family", metavar="PREFIX", help="only this family")
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would go; remove nothing"
    )
    parser.add_argument(
        "--archives",
        action="store_true",
        help="prune the archives of earlier runs (D/archive/) instead of checkpoints",
    )
    parser.add_argument(
        "--keep-archives",
        type=_nonnegative,
        metavar="N",
        help="with --archives: keep the newest N archives",
    )
    parser.add_argument(
        "--older-than",
        type=_days,
        metavar="DAYS",
        help="with --archives: remove the archives made more than DAYS days ago",
    )
    parser.add_argument(
        "--release-lease",
        action="store_true",
        help="of a remote store: release a writer lease whose holder is gone "
        "(watched up to its time to live)",
    )
    # the name of 0.2, refused in one line by run()
    parser.add_argument("--max-ckpt-keep", help=argparse.SUPPRESS)
    for key, doc in OPTIONS.items():
        flags = ["--" + key.replace("_", "-")]
        # an option not given leaves no attribute: ``none`` is a value
        given = {"dest": key, "help": doc, "default": argparse.SUPPRESS}
        if key == "best_metric":
            parser.add_argument(*flags, metavar="NAME", **given)
        elif key == "best_mode":
            parser.add_argument(*flags, choices=BEST_MODES, **given)
        else:
            parser.add_argument(*flags, type=_count, metavar="N", **given)


def policy_for(view: FamilyView, args: argparse.Namespace) -> RetentionPolicy:
    """The recorded policy of ``view`` with the command line's keys in its place."""
    given = {k: getattr(args, k) for k in OPTIONS if hasattr(args, k)}
    recorded = policy_to_dict(view.policy) if view.policy is not None else None
    if recorded is None and not given:
        raise UsageError(
            f"no retention policy is recorded for {view.family.prefix} "
            "(the store has no manifest, or its policy is not expressible as keys); "
            "give one, such as --keep-last 5"
        )
    try:
        return policy_from_dict({**(recorded or {}), **given})
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _nonnegative(value: str) -> int:
    found = _count(value)
    if found is None or found < 0:
        raise argparse.ArgumentTypeError(f"expected a count (0 or more), got {value!r}")
    return found


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = -1.0
    if not days >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"expected days (0 or more), got {value!r}")
    return days


def run(args: argparse.Namespace) -> int:
    """Plan, and unless ``--dry-run`` remove; exit status 1 if the store is held."""
    if args.max_ckpt_keep is not None:
        raise UsageError("--max-ckpt-keep is --keep-last since 0.3")
    archive_flags = args.keep_archives is not None or args.older_than is not None
    if args.archives or archive_flags:
        return run_archives(args)
    inventory = read_inventory(args.directory)
    families = select_families(inventory, args.family)
    policies = {v.family.prefix: policy_for(v, args) for v in families}
    storage = local_storage(inventory.directory)
    lock = None if args.dry_run else StoreLock(inventory.directory, storage=storage)
    if lock is not None:
        lock.acquire()  # StoreLockedError names the run holding it
    try:
        if lock is not None:  # read again under the lock: what we remove is current
            inventory = read_inventory(args.directory)
            families = select_families(inventory, args.family)
        plans = {
            v.family.prefix: v.explain(policies[v.family.prefix], protect_newest=True)
            for v in families
        }
        doomed = [
            (view, v)
            for view in families
            for v in plans[view.family.prefix]
            if not v.kept
        ]
        if lock is not None:
            remove(
                [inventory.directory / v.name for _, v in doomed],
                durable=True,
                storage=storage,
            )
    finally:
        if lock is not None:
            lock.release()
    sizes = {c.name: c.record.size for view in families for c in view.checkpoints}
    freed = sum(sizes.get(v.name, 0) for _, v in doomed)
    if args.json:
        output.print_json(
            as_json(inventory.directory, families, policies, plans, freed, args.dry_run)
        )
    else:
        show(families, policies, plans, sizes, freed, dry_run=args.dry_run)
    return 0


def show(families, policies, plans, sizes, freed: int, *, dry_run: bool) -> None:
    """Print one table per family and a summary."""
    out = output.console()
    gone = 0
    for view in families:
        policy = policies[view.family.prefix]
        rows = output.table(
            f"{view.family.prefix}  policy: {reason_of(policy)}",
            ["step", "file", "size", "outcome"],
            right=("step", "size"),
        )
        for v in plans[view.family.prefix]:
            if v.kept:
                outcome = "kept: " + "; ".join(r for _, r in v.kept_by)
            else:
                gone += 1
                outcome = "would be removed" if dry_run else "removed"
            rows.add_row(str(v.step), v.name, output.size(sizes.get(v.name)), outcome)
        out.print(rows)
    verb = "would remove" if dry_run else "removed"
    out.print(f"{verb} {gone} checkpoint(s), {output.size(freed)}")


def as_json(
    directory, families, policies, plans, freed: int, dry_run: bool
) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "directory": str(directory),
        "dry_run": dry_run,
        "families": [
            {
                "prefix": view.family.prefix,
                "policy": policy_to_dict(policies[view.family.prefix]),
                "reason": reason_of(policies[view.family.prefix]),
                "removed": [v.name for v in plans[view.family.prefix] if not v.kept],
                "kept": [_kept(v) for v in plans[view.family.prefix] if v.kept],
            }
            for view in families
        ],
        "freed": freed,
    }


def _kept(verdict: Verdict) -> dict[str, Any]:
    return {
        "name": verdict.name,
        "kept_by": [{"policy": p, "reason": r} for p, r in verdict.kept_by],
    }


def run_archives(args: argparse.Namespace) -> int:
    """``prune --archives``: remove archives of earlier runs by count or age."""
    if not args.archives:
        raise UsageError("--keep-archives and --older-than go with --archives")
    if args.keep_archives is None and args.older_than is None:
        raise UsageError(
            "--archives needs --keep-archives N or --older-than DAYS (or both)"
        )
    if args.family is not None or any(hasattr(args, k) for k in OPTIONS):
        raise UsageError(
            "--archives prunes archives only: give the checkpoint options "
            "(--family, --keep-last, ...) in another call"
        )
    directory = Path(os.path.abspath(args.directory))
    storage = local_storage(directory)
    lock = None if args.dry_run else StoreLock(directory, storage=storage)
    if lock is not None:
        lock.acquire()  # StoreLockedError names the run holding it
    try:
        folders = archive_folders(directory, storage=storage)
        doomed = archives_beyond(
            folders, keep_last=args.keep_archives, older_than_days=args.older_than
        )
        left = []
        if lock is not None:
            left = [f for f in doomed if not remove_archive(f, storage=storage)]
    finally:
        if lock is not None:
            lock.release()
    removed = [f for f in doomed if f not in left]
    freed = sum(f.size for f in removed)
    if args.json:
        output.print_json(
            {
                "directory": str(directory),
                "dry_run": args.dry_run,
                "archives": {
                    "removed": [f.name for f in removed],
                    "kept": [f.name for f in folders if f not in doomed],
                    "left": [f.name for f in left],
                },
                "freed": freed,
            }
        )
        return 1 if left else 0
    out = output.console()
    rows = output.table(
        "archive/",
        ["folder", "checkpoints", "size", "made (UTC)", "outcome"],
        right=("checkpoints", "size"),
    )
    for f in folders:
        outcome = "kept"
        if f in left:
            outcome = "left: it holds something the store did not put there"
        elif f in doomed:
            outcome = "would be removed" if args.dry_run else "removed"
        rows.add_row(
            f.name,
            str(len(f.checkpoints)),
            output.size(f.size),
            output.utc(f.created),
            outcome,
        )
    out.print(rows)
    verb = "would remove" if args.dry_run else "removed"
    out.print(f"{verb} {len(removed)} archive(s), {output.size(freed)}")
    return 1 if left else 0
