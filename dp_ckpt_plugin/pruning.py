"""Applying a family's retention policy after a commit (rules 11-13).

:class:`Pruner` knows what a store must never remove (the checkpoint just
written, what the pointer and alias name, the checkpoint the run started
from) and removes what :func:`~dp_ckpt_plugin.retention.plan_prune` says,
payloads before records (:func:`~dp_ckpt_plugin.commit.remove`). Planning
reads only the store's catalogue: no record, whatever the number kept.
"""

from __future__ import annotations

from pathlib import Path

from .catalogue import Catalogue
from .checkpoint import Checkpoint
from .commit import remove
from .layout import Family
from .pointers import named_by
from .resume import ResumeState
from .retention import plan_prune
from .storage import Storage


class Pruner:
    """Retention of one store.

    Parameters
    ----------
    directory : Path
        The store directory.
    catalogue : Catalogue
        Its committed checkpoints (kept up to date here).
    resume : ResumeState
        What the run started from.
    storage : Storage
        Where the files are.
    durable : bool
        Whether to fsync.
    """

    def __init__(
        self,
        directory: Path,
        catalogue: Catalogue,
        resume: ResumeState,
        storage: Storage,
        *,
        durable: bool,
    ) -> None:
        self.directory = directory
        self.catalogue = catalogue
        self.resume = resume
        self.storage = storage
        self.durable = durable

    def protected(self, family: Family, current: Path | None = None) -> set[str]:
        """Names retention must not remove in ``family``."""
        named = named_by(self.directory, family, storage=self.storage).values()
        names = {n for n in named if n}
        if current is not None:
            names.add(current.name)
        start = self.resume.protected(family)
        if start is not None:
            names.add(start.name)
        return names

    def prune(self, config, checkpoint: Checkpoint) -> list[Path]:
        """Apply ``config``'s policy after ``checkpoint`` was committed and published."""
        family = config.family
        self.resume.committed(family, checkpoint.step)
        entries = self.catalogue.of(family)
        keeps_all = getattr(config.policy, "keeps_all", None)
        if keeps_all is not None and keeps_all(len(entries)):
            return []  # nothing to plan: the policy keeps a family this size whole
        doomed = plan_prune(
            {c.name: c.step for c in entries.values()},
            current_step=checkpoint.step,
            protected=self.protected(family, checkpoint.path),
            policy=config.policy,
            metrics={c.name: c.record.metrics or {} for c in entries.values()},
        )
        paths = [self.directory / name for name in doomed]
        try:
            remove(paths, durable=self.durable, storage=self.storage)
        finally:  # a failed removal leaves its checkpoint in the catalogue
            for path in paths:
                if self.storage.entry(path) is None:
                    self.catalogue.discard(family, path.name)
        return paths
