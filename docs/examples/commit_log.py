"""An ``on_commit`` observer: remember every committed checkpoint.

Register an instance with the plugin manager (or point the ``dp_ckpt``
entry-point group at a module that creates one). The store has already
committed the checkpoint and moved the latest pointer to it when this runs,
and applies retention after every observer has run.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dp_ckpt_plugin import hookimpl

log = logging.getLogger("commit_log")


class CommitLog:
    """Record the path and step of each committed checkpoint.

    Attributes
    ----------
    committed : list of tuple of (int, Path)
        ``(step, path)`` of every checkpoint committed so far, in order.
    """

    def __init__(self) -> None:
        self.committed: list[tuple[int, Path]] = []

    @hookimpl
    def on_commit(self, checkpoint):
        """Note the checkpoint; never fail, so that training goes on."""
        self.committed.append((checkpoint.step, checkpoint.path))
        log.info(
            "step %d committed to %s (%s)",
            checkpoint.step,
            checkpoint.path,
            checkpoint.record.digest[:19],
        )
