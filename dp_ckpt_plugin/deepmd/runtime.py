"""What every host does around deepmd-kit's training entry: process group, swaps.

- :func:`start_process_group`: under ``torchrun``, start the process group
  before deepmd-kit does, with gloo where there is no GPU (deepmd-kit 3.2
  asks for ``cuda:nccl,cpu:gloo``, which fails without one), so that the
  preflight can broadcast rank 0's resolution;
- :class:`GroupAlreadyUp`: ``torch.distributed`` as a deepmd-kit entry point
  that starts its own group sees it when the group is up already;
- :func:`swapped`: set a deepmd-kit attribute (its ``Trainer`` class, say)
  for the duration of a call.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any


def world_size() -> int:
    """How many ranks this run has (torchrun's ``WORLD_SIZE``, else 1)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def start_process_group() -> bool:
    """Under torchrun, start the process group now; gloo where there is no GPU.

    Returns whether a group was started here.
    """
    if os.environ.get("LOCAL_RANK") is None:
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return False
    dist.init_process_group(
        backend="cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
    )
    return True


class GroupAlreadyUp:
    """``torch.distributed`` whose ``init_process_group`` keeps a group that is up.

    Parameters
    ----------
    dist : module
        ``torch.distributed``; every other attribute is its own.
    """

    def __init__(self, dist: Any) -> None:
        self._dist = dist

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        """Start a group only if none is up."""
        if not self._dist.is_initialized():
            self._dist.init_process_group(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any):
    """Set ``owner.name`` to ``value`` for the duration of a ``with`` block."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)
