"""The one value type of the package: a checkpoint on disk.

A :class:`Checkpoint` is what the store commits, what ``on_commit`` observers
see, what resolution returns (wrapped in a
:class:`~dp_ckpt_plugin.resolution.Resolved` that says how it was found) and
what ``on_freeze`` freezes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

    @property
    def name(self) -> str:
        """The file name."""
        return self.path.name

    @property
    def committed(self) -> bool:
        """Whether a commit record describes it."""
        return self.record is not None

    @property
    def format(self) -> str | None:
        """The format that wrote it, as its record says."""
        return self.record.format if self.record is not None else None
