"""What every host does around deepmd-kit's training entry: process group, swaps.

- :func:`start_process_group`: under ``torchrun``, start the process group
  before deepmd-kit does, with gloo where there is no GPU (deepmd-kit 3.2
  asks for ``cuda:nccl,cpu:gloo``, which fails without one), so that the
  preflight can broadcast rank 0's resolution;
- :class:`GroupAlreadyUp`: ``torch.distributed`` as a deepmd-kit entry point
  that starts its own group sees it when the group is up already;
- :func:`swapped`: set a deepmd-kit attribute (its ``Trainer`` class, say)
  for the duration of a call;
- :func:`settle_gloo_at_exit`: the process ends only once torch's gloo
  threads have let go of their finished work.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import time
from typing import Any

#: The name torch gives the threads that run a gloo process group's work.
GLOO_THREAD = b"pt_gloo_runloop"


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

    settle_gloo_at_exit()
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


@functools.cache
def settle_gloo_at_exit() -> None:
    """At exit, wait until torch's gloo threads have let go of their finished work.

    A gloo worker drops a collective's tensors after the caller saw it
    complete; a tensor made in Python needs the interpreter's lock to go.
    If that happens after Python began to finalize (a rank ending right
    after its last collective, the trainer's model still holding the
    group), the thread is ended inside C++ and the rank dies of SIGABRT.
    Registered once per process, run before finalization: the lock is
    left free until no gloo thread has been running for a few checks.
    """
    atexit.register(settle_gloo_threads)


def settle_gloo_threads(timeout: float = 2.0) -> None:
    """Sleep (the interpreter's lock free) until no gloo thread runs, at most ``timeout`` s."""
    end = time.monotonic() + timeout
    quiet = 0
    while quiet < 3 and time.monotonic() < end:
        time.sleep(0.002)
        quiet = 0 if gloo_threads_running() else quiet + 1


def gloo_threads_running() -> bool:
    """Whether a gloo worker thread of this process is running or runnable."""
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        start, end = stat.find(b"("), stat.rfind(b")")
        name, state = stat[start + 1 : end], stat[end + 2 : end + 3]
        if name == GLOO_THREAD and state in (b"R", b"D"):
            return True
    return False
