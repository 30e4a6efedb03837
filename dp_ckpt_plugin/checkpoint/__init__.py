"""The one value type of the package: a checkpoint on disk.

A :class:`Checkpoint` is what the store commits, what resolution returns
(wrapped in a :class:`~dp_ckpt_plugin.resolution.Resolved` that says how it
was found) and what ``on_freeze`` freezes. A :class:`Commit` is what
``on_commit`` observers see: the checkpoint and the store it went into, read
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

from ..retention import Candidate
from .records import CommitRecord


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint file.

    Attributes
    ----------
    path : Path
        Where it lies (absolute).
    step : int or None
        Its step: from the commit record, else from the file name, else
        ``None``.
    family : str or None
        The prefix of its family (such as ``model.ckpt``), where known.
    record : CommitRecord or None
        Its commit record; ``None`` for a file written without the plugin
        (by plain deepmd-kit, say), which is never "committed".
    """

    path: Path
    step: int | None
    family: str | None
    record: CommitRecord | None = None

    name = property(attrgetter("path.name"), doc="The file name.")

    @property
    def committed(self) -> bool:
        """Whether a commit record describes it."""
        return self.record is not None

    @property
    def format(self) -> str | None:
        """The format that wrote it, as its record says."""
        return self.record.format if self.record is not None else None

    def candidate(self) -> Candidate:
        """The checkpoint as a retention policy sees it (name, step, metrics)."""
        metrics = self.record.metrics if self.record is not None else None
        return Candidate(self.name, self.step, metrics)


@dataclass(frozen=True)
class Commit:
    """A checkpoint just committed and published, as observers see it.

    Attributes
    ----------
    checkpoint : Checkpoint
        ``path``, ``step``, ``family`` and commit ``record``.
    directory : Path
        The store directory it went into.
    format : str
        The store's format.
    published : Path
        What the family's pointer and alias name now (the checkpoint itself,
        or for a family ranked by a metric, its best one).
    families : tuple of str
        The prefixes of the store's families, the primary one first.
    """

    checkpoint: Checkpoint
    directory: Path
    format: str
    published: Path
    families: tuple[str, ...] = ()

    path = property(attrgetter("checkpoint.path"), doc="The checkpoint file.")
    step = property(attrgetter("checkpoint.step"), doc="Its step.")
