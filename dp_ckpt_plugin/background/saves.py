"""The background writer: at most one save in flight, errors never lost.

An asynchronous save stalls the training loop only for a consistent snapshot
of the payload (:class:`~dp_ckpt_plugin.background.snapshot.Snapshotter`); serialization,
write, hash, fsync, commit, publication and retention run on one worker
thread. Policy:

- at most one save is in flight: submitting a new one first waits for the
  previous one (so snapshot buffers are reused only when free, and a slow
  disk slows training down instead of piling up memory);
- submissions are serialized: waiting for the previous save, taking the
  snapshot and starting the save happen under one lock, so threads sharing
  a store never snapshot into buffers another save is still reading, and
  every save's own payload is the one written (rule 33);
- the error of a failed save is raised exactly once: by the next
  :meth:`submit`, by :meth:`wait` or by :meth:`shutdown`, whichever comes
  first, in whichever thread;
- the worker is not a daemon: the interpreter waits for the last save at
  exit, and the store's ``close`` waits for it explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..storage.forks import OwnedLock
from .snapshot import Snapshotter

if TYPE_CHECKING:
    from .process import WriterProcess


class BackgroundWriter:
    """One worker thread running saves one at a time.

    Parameters
    ----------
    process : WriterProcess, optional
        With a writer process, payloads are snapshotted into shared memory
        and written by it (:mod:`~dp_ckpt_plugin.background.process`); the
        worker thread then only waits for it, and commits.
    """

    def __init__(self, process: WriterProcess | None = None) -> None:
        self.process = process
        if process is None:
            self.snapshots = Snapshotter()
        else:
            from .shm import SharedSnapshotter

            self.snapshots = SharedSnapshotter()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._lock = OwnedLock("a store's background writer", reentrant=False)

    @classmethod
    def for_store(cls, store, writer: str) -> BackgroundWriter:
        """The background writer of ``store``, a process or a thread as ``writer`` asks."""
        from .process import WriterProcess, uses_process

        if not uses_process(writer, store.format.name, store.storage, store.hooks):
            return cls()
        return cls(WriterProcess(store.directory, store.storage, store.format.name))

    def take(self, step: int, state: Any) -> Any:
        """A consistent copy of ``state``, or what the writer process writes."""
        if self.process is None:
            return self.snapshots.take(state)
        from .process import ProcessPayload

        self.process.start()  # it imports torch while the snapshot is taken
        return ProcessPayload(
            self.process, self.snapshots, step, self.snapshots.take(state)
        )

    def submit(self, prepare: Callable[[], tuple], work: Callable[..., Any]) -> None:
        """Wait for the previous save (raising its error), then start ``work``.

        ``prepare`` runs once the previous save is done, under the lock, and
        returns the arguments of ``work`` (the snapshot of the payloads).
        """
        with self._lock:
            self._wait()
            args = prepare()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    1, thread_name_prefix="dp_ckpt-save"
                )
            self._pending = self._executor.submit(self._after_copies, work, *args)

    def _after_copies(self, work: Callable[..., Any], *args: Any) -> Any:
        self.snapshots.ready()  # the snapshot's device-to-host copies are done
        return work(*args)

    def wait(self) -> None:
        """Wait for the save in flight, if any; raise its error if it failed."""
        with self._lock:
            self._wait()

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def shutdown(self) -> None:
        """Wait for the save in flight and stop the worker; raise its error."""
        with self._lock:
            try:
                self._wait()
            finally:
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                    self._executor = None
                try:
                    if self.process is not None:
                        self.process.close()
                finally:
                    # the state's copies: its size in memory (with the writer
                    # process, memory files of two descriptors each)
                    self.snapshots.close()
