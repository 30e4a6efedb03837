"""What a forked child does with what the plugin kept in its parent.

A child made by ``fork`` (``os.fork``, ``multiprocessing``'s fork start
method) has its parent's memory but only the thread that forked: a thread, a
thread pool or a lock another thread held is there in name only. Everything
the plugin keeps in a process is one of two kinds (``docs/guarantees.md``,
rule 43):

- **the process's own**: module-level locks (torch's allowlist, the storage
  registry, the probe) are made anew in the child
  (:func:`in_child`, run by ``os.register_at_fork``); BLAKE3's thread pool,
  which a child cannot get back, is not used there
  (:mod:`~dp_ckpt_plugin.checkpoint.digests` hashes on one thread);
- **a store's**: its mutex, its lock on ``D``, the background writer's
  thread, the writer process, the upload and lease threads of a remote store
  and its lease belong to the process that built the store. Their locks are
  :class:`OwnedLock`: in a forked child every use of the store is refused
  with ``ForkedError``, in one line, before any
  lock is waited for. A store built in the child is the child's own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..errors import ForkedError

_hooks: list[Callable[[], None]] = []


def in_child(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook`` in every child forked from now on (before any other code)."""
    _hooks.append(hook)
    return hook


def _after_fork() -> None:
    for hook in _hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class OwnedLock:
    """A (reentrant) lock that belongs to the process that made it.

    Parameters
    ----------
    what : str
        What it guards, for the refusal (``"the checkpoint store of D"``).
    reentrant : bool
        An ``RLock`` (default) or a ``Lock``.
    """

    def __init__(self, what: str, *, reentrant: bool = True) -> None:
        self.what = what
        self.owner = os.getpid()
        self._lock = threading.RLock() if reentrant else threading.Lock()

    def check(self) -> None:
        """Raise :class:`ForkedError` in a process other than the owner."""
        if os.getpid() != self.owner:
            raise ForkedError(
                f"{self.what} belongs to process {self.owner}, and this process "
                f"({os.getpid()}) is a fork of it, without its threads: build "
                "a new CheckpointManager (or store) in this process, or start "
                "it with multiprocessing's 'forkserver' or 'spawn' method"
            )

    def __enter__(self) -> OwnedLock:
        self.check()
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
