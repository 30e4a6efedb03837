"""``dp-ckpt adopt D``: commit records for numbered checkpoints that have none.

Plain deepmd-kit (or any trainer without the plugin) writes numbered
checkpoints without commit records: ``latest`` does not see them and
retention does not count them. ``adopt`` loads each through the
``on_load_step`` hook of its format (the store manifest's, else the
registered format of its suffix) and, if it loads, writes its commit record,
with the store's lock held. A file that does not load is reported and left
without a record; a malformed record is never overwritten. ``--dry-run``
checks and reports, writing nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..checkpoint.layout import Family, parse_numbered
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..storage import default_storage
from ..store.adoption import Adoption, adopt_directory
from . import FAILURE, flag, output, store_directory
from .inventory import read_inventory
from .views import Listing

HELP = "give commit records to numbered checkpoints written without the plugin"
DESCRIPTION = (
    "Find the numbered checkpoints of a store directory that have no commit "
    "record (as plain deepmd-kit writes them), check that each loads through "
    "its format's on_load_step hook and write its commit record, holding the "
    "store's lock. A file that does not load is reported and left alone; a "
    "malformed record is never overwritten."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``adopt``."""
    parser.add_argument("directory", type=store_directory, help="the store (save_dir)")
    flag(parser, "--dry-run", "check and report what would be adopted, writing nothing")


def run(args: argparse.Namespace) -> int:
    """Adopt; exit status 1 when a file does not load."""
    pm = get_plugin_manager()
    listing = read_inventory(args.directory)
    directory = Path(listing.where)
    families = families_of(listing, Hooks(pm).formats())
    found = adopt_directory(directory, families, pm, dry_run=args.dry_run)
    if args.json:
        output.print_json(as_json(directory, found, args.dry_run))
    else:
        show(found, args.dry_run)
    return FAILURE if any(a.refused for a in found) else 0


def families_of(listing: Listing, formats) -> list[tuple[Family, str]]:
    """Each family of the store with the format of its files.

    The families the store knows (manifest, records, pointers), then any
    numbered files whose suffix is a registered format's.
    """
    by_suffix = {info.suffix: name for name, info in formats.items()}
    found: dict[str, tuple[Family, str]] = {}
    for shelf in listing.families:
        fmt = listing.format or by_suffix.get(shelf.suffix)
        if fmt is not None:
            found[shelf.prefix + shelf.suffix] = (shelf.family(), fmt)
    for name, kind in sorted(default_storage().names(Path(listing.where))):
        match = parse_numbered(name) if kind == "file" else None
        if match is None or match.suffix not in by_suffix:
            continue
        family = Family(match.prefix, match.suffix)
        found.setdefault(match.prefix + match.suffix, (family, by_suffix[match.suffix]))
    return list(found.values())


def as_json(directory, found: list[Adoption], dry_run: bool) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    return {
        "directory": str(directory),
        "dry_run": dry_run,
        "adopted": [
            {
                "name": c.name,
                "path": str(c.path),
                "family": c.family,
                "step": c.step,
                "format": a.format,
                "size": c.record.size,
                "digest": c.record.digest,
            }
            for a in found
            for c in a.adopted
        ],
        "refused": [
            {"name": p.name, "path": str(p), "format": a.format, "problem": why}
            for a in found
            for p, why in a.refused
        ],
        "malformed_records": [
            {"name": p.name, "path": str(p)} for a in found for p in a.malformed
        ],
    }


def show(found: list[Adoption], dry_run: bool) -> None:
    """Print for people."""
    out = output.console()
    verb = "would adopt" if dry_run else "adopted"
    adopted = [(a, c) for a in found for c in a.adopted]
    for a, c in adopted:
        out.print(f"{verb}  {c.name}  step {c.step}  ({a.format}, loads)")
    for a in found:
        for p, why in a.refused:
            out.print(f"refused  {p.name}: does not load as {a.format} ({why})")
        for p in a.malformed:
            out.print(f"left alone  {p.name}: its commit record is malformed")
    if not adopted and not any(a.refused or a.malformed for a in found):
        out.print("nothing to adopt: every numbered checkpoint has a commit record")
    elif dry_run:
        out.print(f"dry run: {len(adopted)} file(s) would be adopted; nothing written")
    else:
        out.print(f"{len(adopted)} file(s) adopted")
