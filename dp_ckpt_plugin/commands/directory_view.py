"""A store directory as the commands see it (``views.StoreView``).

Read through ``inventory.read_inventory`` (nothing moved, hashed or
locked); a checkpoint is checked through
:func:`dp_ckpt_plugin.checkpoint.records.verify`, a restart resolved through
the same front door as a training run's (installed resolvers included), and
``prune`` removes under the store's lock, payload before record.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

from ..checkpoint import records
from ..checkpoint.pointers import named_by
from ..errors import CorruptCheckpointError, RestartNotFoundError
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..resolution import ResolveContext, resolve_restart
from ..storage import default_storage, is_file, local_storage
from ..store.lock import StoreLock
from ..store.pruning import remove
from .inventory import listed, read_inventory
from .origins import input_of
from .views import Check, Decide, Listed, Listing, Resolution, select


class DirectoryView:
    """A store directory (its path need not be absolute)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.where = str(self.directory)

    def listing(self, prefix: str | None = None) -> Listing:
        listing = read_inventory(self.directory)
        listing.families = select(listing.families, prefix, self.where)
        return listing

    def pointer_problems(self, listing: Listing) -> list[str]:
        """Pointers and aliases that name a file that is not there; what they
        name is read again first (a run may have moved them on meanwhile)."""
        storage = default_storage()
        problems = []
        for shelf in listing.families:
            family = shelf.family()
            for kind, named, where in (
                ("pointer", shelf.latest, family.pointer),
                ("alias", shelf.alias, family.alias),
            ):
                if named is None or is_file(self.directory / named):
                    continue
                now = named_by(self.directory, family, storage=storage)[kind]
                if now not in (None, named) and is_file(self.directory / now):
                    continue
                problems.append(
                    f"{kind} {self.directory / where} names {named}, "
                    "which does not exist"
                )
        return problems

    def check(self, item: Listed, *, digest: bool) -> Check:
        """Size first; the file is read and hashed only when it matches."""
        path, hashed = Path(item.where), 0
        try:
            records.verify(path, item.record, digest=False)
            if digest:
                hashed = item.size
                records.verify(path, item.record, digest=True)
        except FileNotFoundError:
            return Check(item, gone=True)
        except CorruptCheckpointError as exc:
            if default_storage().entry(path) is None:
                return Check(item, gone=True)
            return Check(item, str(exc), hashed=hashed)
        return Check(item, hashed=hashed)

    def resolve(self, spec: str, *, digest: bool) -> Resolution:
        families = read_inventory(self.directory).families
        if not families:
            raise RestartNotFoundError(
                f"no checkpoint found for restart {spec!r}: {self.directory} "
                "holds no checkpoint family (no commit record, manifest or pointer)"
            )
        context = ResolveContext(
            family=families[0].family(),
            store_dir=self.directory,
            cwd=Path.cwd(),
            digest=digest,
            quarantine=False,
        )
        found = resolve_restart(Hooks(get_plugin_manager()), spec, context)
        c = found.checkpoint
        return Resolution(
            item=listed(c),
            how=found.how,
            checked=found.checked,
            record=c.record,
            warnings=tuple(found.warnings),
            fell_back=found.fell_back,
            input=input_of(c.path, c.record),
        )

    def fetch(self, spec: str) -> tuple[Path, str | None, list[str]]:
        """The file itself: inspect reads it and checks it against its record."""
        return self.directory / spec, None, []

    def prune(
        self, prefix: str | None, decide: Decide, *, dry_run: bool
    ) -> tuple[Listing, list[Listed]]:
        storage = local_storage(self.directory)
        # StoreLockedError names the run holding it; a dry run takes no lock
        with nullcontext() if dry_run else StoreLock(self.directory, storage=storage):
            listing = self.listing(prefix)  # read under the lock: what goes is current
            doomed = decide(listing)
            if not dry_run:
                remove([Path(c.where) for c in doomed], durable=True, storage=storage)
        return listing, doomed
