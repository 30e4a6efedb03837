"""Who may touch the filesystem, and how ranks agree on a result.

Only the chief rank (rank 0) writes. Results the chief computes, such as the
resolved restart path, are broadcast so that every rank uses the same one.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Ranks(Protocol):
    """The collective view a store needs."""

    rank: int

    def broadcast(self, value: T) -> T:
        """Return the chief's ``value`` on every rank."""
        ...


class SingleProcess:
    """One process: it is the chief and broadcasting is the identity."""

    rank = 0

    def broadcast(self, value: T) -> T:
        """Return ``value``."""
        return value


class TorchDistributed:
    """Ranks of an initialized ``torch.distributed`` process group."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()

    def broadcast(self, value: Any) -> Any:
        """Broadcast a picklable value from rank 0."""
        box = [value if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]


def current_ranks() -> Ranks:
    """Return the ranks of this process: torch's if a group is up, else one."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return TorchDistributed()
    return SingleProcess()


def world_size_of(ranks: Ranks) -> int:
    """How many ranks ``ranks`` has (1 for a single process)."""
    dist = getattr(ranks, "_dist", None)
    return int(dist.get_world_size()) if dist is not None else 1
