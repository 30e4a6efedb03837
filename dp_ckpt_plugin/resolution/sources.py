"""Typed values resolution carries for a remote store and its checkpoints.

:class:`RemoteSource` (where the store is) is what a store staging for a
remote store puts into its :class:`~dp_ckpt_plugin.resolution.ResolveContext`;
the remote resolver (``dp_ckpt_plugin.remote.resolver``) reads it, the front
door never does. :class:`Origin` (where a checkpoint came from) is what
:attr:`~dp_ckpt_plugin.resolution.Resolved.source` holds for a checkpoint
fetched from a remote store (:class:`dp_ckpt_plugin.remote.fetch.Found` is
one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..storage import Storage
from ..storage.objects import ObjectStorage


@dataclass(frozen=True)
class RemoteSource:
    """A remote store as resolution reads it.

    Attributes
    ----------
    storage : dp_ckpt_plugin.storage.objects.ObjectStorage
        Where it is.
    staging : Path
        The local directory its checkpoints are fetched into.
    local : dp_ckpt_plugin.storage.Storage
        The local storage of ``staging``.
    durable : bool
        Whether fetched copies are fsynced.
    best_family : str or None
        The family ``best`` means, if the store has one.
    """

    storage: ObjectStorage
    staging: Path
    local: Storage
    durable: bool = True
    best_family: str | None = None


@runtime_checkable
class Origin(Protocol):
    """Where a resolved checkpoint was fetched from: a store's URL and family."""

    @property
    def url(self) -> str:
        """The URL of the store it came from."""
        ...

    @property
    def family(self) -> str:
        """The family it belongs to there."""
        ...

    @property
    def key_url(self) -> str:
        """The URL of its payload."""
        ...
