"""What a store needs of the remote store it stages for: the :class:`Replica` seam.

A :class:`~dp_ckpt_plugin.store.core.CheckpointStore` with a local ``save_dir``
has none (``remote=None``); one staging for a store on object storage holds a
:class:`~dp_ckpt_plugin.remote.replica.RemoteStore`, built by
:func:`dp_ckpt_plugin.remote.factory.open_remote`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..checkpoint import Checkpoint
from ..resolution import Resolved
from ..resolution.sources import RemoteSource
from .catalogue import Catalogue
from .family import FamilyConfig
from .place import StorePlace


class Staging(Protocol):
    """What a remote store reads of the local store that stages for it."""

    @property
    def place(self) -> StorePlace:
        """The staging directory, its storage and durability."""
        ...

    @property
    def catalogue(self) -> Catalogue:
        """Its committed checkpoints."""
        ...

    @property
    def families(self) -> dict[str, FamilyConfig]:
        """Its families by prefix."""
        ...

    @property
    def is_chief(self) -> bool:
        """Whether this process writes."""
        ...


@runtime_checkable
class Replica(Protocol):
    """The remote side of a store, called by it on its save line and by resolution."""

    @property
    def url(self) -> str:
        """The remote store's URL."""
        ...

    @property
    def epoch(self) -> int | None:
        """This writer's epoch once started (its checkpoints' lineage), else ``None``."""
        ...

    def start(self, store: Staging | None = None) -> None:
        """Take the lease and fence HEAD; queue what ``store`` staged and never sent."""
        ...

    def finish(self, staging: Path) -> None:
        """Wait (bounded) for uploads in flight, release the lease; raise what is left."""
        ...

    def check(self) -> None:
        """Raise what stopped the uploads for good (fenced off, a malformed HEAD)."""
        ...

    def submit(self, jobs: Sequence[tuple[FamilyConfig, Checkpoint]]) -> None:
        """Queue the checkpoints committed for one step; return at once."""
        ...

    def protected(self, prefix: str) -> set[str]:
        """Names of staged checkpoints of ``prefix`` retention must keep (not sent yet)."""
        ...

    def start_run(self) -> str | None:
        """Archive what an earlier run left in the remote store, once; its key."""
        ...

    def source(self, store: Staging) -> RemoteSource:
        """What resolution reads the remote store as."""
        ...

    def staged(self, found: Resolved, store: Staging, *, continues: bool) -> Resolved:
        """``found`` on this rank's disk, protected when it is one of this store's."""
        ...

    @property
    def upload_wait(self) -> float:
        """How long the end of a run waits for uploads in flight, in seconds."""
        ...

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued upload is done; ``False`` on timeout."""
        ...

    def sent_url(self, name: str) -> str | None:
        """The URL of the newest upload of the checkpoint file ``name``, or ``None``."""
        ...

    def read_input(self, digest: str) -> dict | None:
        """The training input of ``digest`` kept in the remote store, if it is there."""
        ...
