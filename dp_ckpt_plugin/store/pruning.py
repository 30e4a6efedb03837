"""Applying a family's retention policy after a commit (rules 11-13).

:class:`Pruner` knows what a store must never remove (the checkpoint just
written, what the pointer and alias name, the checkpoint the run started
from) and removes what :func:`~dp_ckpt_plugin.retention.plan_prune` says,
payloads before records. Planning reads only the store's catalogue: no
record, whatever the number kept.

A prune makes no fsync of its own: the payloads go at once, and their
records once the removal of the payloads is durable, which the directory's
next fsync (the next save's, or :meth:`Pruner.settle` at close) makes it.
Until then a record names no file and nothing counts it; a power loss may
bring a pruned checkpoint back whole (payload and record), never a payload
without its record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.layout import Family
from ..checkpoint.pointers import named_by
from ..checkpoint.records import record_path
from ..checkpoint.resume import ResumeState
from ..retention import plan_prune
from ..storage import Storage
from .catalogue import Catalogue


class Pruner:
    """Retention of one store.

    ``catalogue``: its committed checkpoints (kept up to date here) and its
    place; ``resume``: what the run started from; ``uploading(prefix)``: the
    names of a family's checkpoints still to be uploaded to a remote store
    (kept until they are), if any.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        resume: ResumeState,
        uploading: Callable[[str], set[str]] | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.place = catalogue.place
        self.resume = resume
        self.uploading = uploading
        #: Records whose payloads were removed, waiting for a directory fsync.
        self.pending: list[Path] = []

    def protected(self, family: Family, current: Path) -> set[str]:
        """Names retention must not remove in ``family`` (``current``: just written)."""
        named = named_by(self.place.directory, family, storage=self.place.storage)
        names = {n for n in named.values() if n} | {current.name}
        start = self.resume.protected(family)
        if start is not None:
            names.add(start.name)
        if self.uploading is not None:
            names |= self.uploading(family.prefix)
        return names

    def settle(self, *, synced: bool) -> None:
        """Remove the records left by earlier prunes.

        ``synced`` says the store directory was fsynced since those payloads
        were removed (a save since then did); otherwise it is fsynced first.
        """
        if not self.pending:
            return
        storage = self.place.storage
        if not synced:
            storage.sync_dir(self.place.directory, holding=self.pending)
        records, self.pending = self.pending, []
        try:
            remove_records(records, storage=storage)
        finally:
            self.pending = [r for r in records if storage.entry(r) is not None]

    def prune(self, config, checkpoint: Checkpoint) -> list[Path]:
        """Apply ``config``'s policy after ``checkpoint`` was committed and published.

        The records of the previous prune go first: this save fsynced the
        directory after their payloads' removal.
        """
        self.settle(synced=True)
        family = config.family
        self.resume.committed(family, checkpoint.step)
        if config.policy.keeps_all(len(self.catalogue.of(family))):
            return []  # nothing to plan: the policy keeps a family this size whole
        doomed = plan_prune(
            self.catalogue.candidates(family),
            current_step=checkpoint.step,
            protected=self.protected(family, checkpoint.path),
            policy=config.policy,
        )
        place = self.place
        paths = [place.directory / name for name in doomed]
        try:
            remove_payloads(
                paths, durable=place.durable, storage=place.storage, left=self.pending
            )
        finally:  # a failed removal leaves its checkpoint in the catalogue
            for path in paths:
                if place.storage.entry(path) is None:
                    self.catalogue.discard(family, path.name)
        return paths


def remove(paths: list[Path], *, durable: bool, storage: Storage) -> None:
    """Remove committed checkpoints (retention): payloads, then records.

    The payloads' removal is made durable before any record goes: a crash in
    between leaves small records that name no file (the next open sweeps
    them), never a full-size payload without a record that no rule would
    remove.
    """
    records: list[Path] = []
    remove_payloads(paths, durable=durable, storage=storage, left=records)
    if records:
        storage.sync_dir(paths[0].parent, holding=paths)
        remove_records(records, storage=storage)
        storage.sync_dir(paths[0].parent, holding=paths)


def remove_payloads(
    paths: list[Path], *, durable: bool, storage: Storage, left: list[Path]
) -> None:
    """Remove the payloads of committed checkpoints; add their records to ``left``.

    A record may go only once the removal of its payload is durable (a
    later fsync of the directory); until then it names no file, and nothing
    counts it. Not durable: the records go at once. A failure leaves in
    ``left`` the records of the payloads already removed.
    """
    for path in paths:
        storage.remove(path)
        if durable:
            left.append(record_path(path))
        else:
            storage.remove(record_path(path))


def remove_records(records: list[Path], *, storage: Storage) -> None:
    """Remove records whose payloads' removal is durable.

    Their own removal needs no fsync: a record that comes back after a power
    loss names no file, and the next open sweeps it.
    """
    for record in records:
        storage.remove(record)
