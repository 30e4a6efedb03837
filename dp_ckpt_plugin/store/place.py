"""Where a store is: its directory, the storage that touches it, and whether it fsyncs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..storage import Storage


@dataclass(frozen=True)
class StorePlace:
    """The three facts every step of a store's save line needs, held once.

    Made by :class:`~dp_ckpt_plugin.store.core.CheckpointStore` and handed
    to its catalogue, committer, publisher and pruner.
    """

    directory: Path
    storage: Storage
    durable: bool = True
