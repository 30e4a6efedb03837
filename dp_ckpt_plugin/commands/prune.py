"""``dp-ckpt prune D``: apply a retention policy to a store now.

The policy of each family is the one the store's manifest records, with the
keys given on the command line (``--keep-last``, ``--keep-every-n-steps``,
``--keep-best``, ``--best-metric``, ``--best-mode``) in place of the recorded
ones. As in a running store, the checkpoints the pointer and alias name and
the newest one are never removed, and each removal takes the payload before
its record. The store's lock is held throughout: a store a run is writing is
refused, naming the run. ``--dry-run`` shows what would go and removes
nothing. A store on object storage records no policy (the keys are needed)
and is pruned under its writer lease (``commands.views``);
``--release-lease`` releases a lease whose holder is gone.

``--archives`` prunes the archives of earlier runs (``D/archive/<UTC>/``)
instead: ``--keep-archives N`` keeps the newest N, ``--older-than DAYS``
removes those made longer ago; given both, an archive goes when either says
so. The same lock, the same ``--dry-run``.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
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
from ..text import shown
from . import UsageError, at_least, flag, is_remote, output, store_directory
from .ls import archive_cells
from .open_store import open_view
from .views import Leased, Listed, Listing, Shelf, StoreView

HELP = "remove what a retention policy does not keep"
DESCRIPTION = (
    "Apply a retention policy to a store directory now: the policy its "
    "manifest records, with the keys given here in place of the recorded "
    "ones. The checkpoints the pointer and alias name, and the newest, are "
    "never removed. Refused while a run holds the store."
)


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
    flag(parser, "--dry-run", "show what would go; remove nothing")
    flag(
        parser,
        "--archives",
        "prune the archives of earlier runs (D/archive/) instead of checkpoints",
    )
    parser.add_argument(
        "--keep-archives",
        type=at_least(_count, 0, "a count (0 or more)"),
        metavar="N",
        help="with --archives: keep the newest N archives",
    )
    parser.add_argument(
        "--older-than",
        type=at_least(float, 0, "days (0 or more)"),
        metavar="DAYS",
        help="with --archives: remove the archives made more than DAYS days ago",
    )
    flag(
        parser,
        "--release-lease",
        "of a remote store: release a writer lease whose holder is gone "
        "(watched up to its time to live)",
    )
    # the name of 0.2, refused in one line by run()
    parser.add_argument("--max-ckpt-keep", help=argparse.SUPPRESS)
    # the options are the policy keys; one not given leaves no attribute
    # (``none`` is a value)
    kinds = {"best_metric": {"metavar": "NAME"}, "best_mode": {"choices": BEST_MODES}}
    for key, doc in POLICY_KEYS.items():
        parser.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            help=doc,
            default=argparse.SUPPRESS,
            **kinds.get(key, {"type": _count, "metavar": "N"}),
        )


def policy_for(shelf: Shelf, args: argparse.Namespace) -> RetentionPolicy:
    """The recorded policy of ``shelf`` with the command line's keys in its place."""
    given = {k: getattr(args, k) for k in POLICY_KEYS if hasattr(args, k)}
    recorded = policy_to_dict(shelf.policy) if shelf.policy is not None else None
    if recorded is None and not given:
        raise UsageError(
            f"no retention policy is recorded for {shelf.prefix} "
            "(a directory without a manifest, a policy not expressible as keys, "
            "or a store on object storage, whose HEAD records none); "
            "give one, such as --keep-last 5"
        )
    with UsageError.on(ValueError):
        return policy_from_dict({**(recorded or {}), **given})


def run(args: argparse.Namespace) -> int:
    """Plan, and unless ``--dry-run`` remove; exit status 1 if the store is held."""
    if args.max_ckpt_keep is not None:
        raise UsageError("--max-ckpt-keep is --keep-last since 0.3")
    view = open_view(args.directory)
    if args.release_lease:
        return release(view)
    if args.archives or args.keep_archives is not None or args.older_than is not None:
        if is_remote(args.directory):
            raise UsageError(
                f"{view.where}: --archives prunes a store directory's archive/"
            )
        return run_archives(args)
    plans: list[Plan] = []

    def decide(listing: Listing) -> list[Listed]:
        doomed = []
        for shelf in listing.families:
            policy = policy_for(shelf, args)
            plan = shelf.explain(policy)
            plans.append((shelf, policy, plan))
            gone = {v.name for v in plan if not v.kept}
            doomed += [c for c in shelf.items if c.name in gone]
        return doomed

    listing, doomed = view.prune(args.family, decide, dry_run=args.dry_run)
    freed = sum(c.size for c in doomed)
    if args.json:
        output.print_json(as_json(listing.where, plans, freed, args.dry_run))
    else:
        show(plans, freed, dry_run=args.dry_run)
    return 0


def release(view: StoreView) -> int:
    """``--release-lease``: release a writer lease whose holder is gone."""
    if not isinstance(view, Leased):
        raise UsageError(
            f"{view.where}: --release-lease is for a store on object storage"
        )
    why = view.release_lease()
    said = "no lease" if why is None else f"lease released ({shown(why)})"
    sys.stdout.write(f"{view.where}: {said}\n")
    return 0


#: Rows of a family's table past which the removed ones are counted, not listed
#: (``--json`` lists them all).
MAX_ROWS = 1000


#: A family, the policy applied to it and its verdicts.
Plan = tuple[Shelf, RetentionPolicy, list[Verdict]]


def show(plans: list[Plan], freed: int, *, dry_run: bool) -> None:
    """Print one table per family and a summary."""
    out = output.console()
    gone = 0
    verb = "would be removed" if dry_run else "removed"
    for shelf, policy, verdicts in plans:
        rows = output.table(
            f"{shelf.prefix}  policy: {reason_of(policy)}",
            ["step", "file", "size", "outcome"],
            right=("step", "size"),
        )
        sizes = {c.name: c.size for c in shelf.items}
        removed = sum(not v.kept for v in verdicts)
        listed = len(verdicts) <= MAX_ROWS
        for v in verdicts:
            if v.kept:
                outcome = "kept: " + "; ".join(r for _, r in v.kept_by)
            elif listed:
                outcome = verb
            else:
                continue
            rows.add_row(str(v.step), v.name, output.size(sizes.get(v.name)), outcome)
        if not listed:
            rows.add_row("", f"{removed} other checkpoint(s)", "", verb)
        gone += removed
        out.print(rows)
    verb = "would remove" if dry_run else "removed"
    out.print(f"{verb} {gone} checkpoint(s), {output.size(freed)}")


def as_json(where: str, plans: list[Plan], freed: int, dry_run: bool) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "directory": where,
        "dry_run": dry_run,
        "families": [
            {
                "prefix": shelf.prefix,
                "policy": policy_to_dict(policy),
                "reason": reason_of(policy),
                "removed": [v.name for v in plan if not v.kept],
                "kept": [_kept(v) for v in plan if v.kept],
            }
            for shelf, policy, plan in plans
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
    if args.family is not None or any(hasattr(args, k) for k in POLICY_KEYS):
        raise UsageError(
            "--archives prunes archives only: give the checkpoint options "
            "(--family, --keep-last, ...) in another call"
        )
    directory = Path(os.path.abspath(args.directory))
    storage = local_storage(directory)
    # StoreLockedError names the run holding it; a dry run takes no lock
    with nullcontext() if args.dry_run else StoreLock(directory, storage=storage):
        folders = archive_folders(directory, storage=storage)
        doomed = archives_beyond(
            folders, keep_last=args.keep_archives, older_than_days=args.older_than
        )
        removable = [] if args.dry_run else doomed
        left = [f for f in removable if not remove_archive(f, storage=storage)]
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
        rows.add_row(*archive_cells(f), outcome)
    out.print(rows)
    verb = "would remove" if args.dry_run else "removed"
    out.print(f"{verb} {len(removed)} archive(s), {output.size(freed)}")
    return 1 if left else 0
