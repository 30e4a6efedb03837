"""The store's side of the writer process (background saves, torch or HDF5 format).

A background save in a thread shares the interpreter lock with the training
loop: ``torch.save``'s pickling holds it, and the loop waits. With a writer
process the payload is serialized, written, hashed and fsynced in another
interpreter (``dp_ckpt_plugin.background.child``), fed from the shared buffers of
a :class:`~dp_ckpt_plugin.background.shm.SharedSnapshotter`; the store's background
thread only waits for its answer, then commits, publishes and prunes.

- The process is started at the first background save (``subprocess``, not
  ``multiprocessing``: nothing of the user's main module is run again) and
  ends at :meth:`WriterProcess.close`, or by itself when this process is gone
  (its socket closes), so it never outlives the run.
- An error of the write comes back as the error it was
  (:class:`~dp_ckpt_plugin.errors.CheckpointWriteError` naming the path and
  cause, or a ``TypeError``), raised by the background save, so the store
  raises it once at the next save, ``wait`` or ``close``.
- A writer process that dies (killed, out of memory) is detected: its socket
  reaches its end, the save raises :class:`CheckpointWriteError` saying so
  (with its exit status), and the next save starts a new one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import sendfds
from pathlib import Path

from ..errors import CheckpointWriteError, ConfigError
from ..storage import Storage
from ..storage.forks import in_child
from ..storage.temp import remove_leftover, temp_pid, temp_target

#: Seconds :meth:`WriterProcess.close` waits for the process before killing it.
CLOSE_TIMEOUT = 30.0


#: The writer processes of this process's stores.
_STARTED: weakref.WeakSet = weakref.WeakSet()


@in_child
def _forked() -> None:
    """A forked child lets go of its parent's writer processes (their sockets
    close here), so each still ends with the process that started it."""
    for writer in list(_STARTED):
        writer._let_go()


class WriterProcess:
    """One writer process for one store directory.

    Parameters
    ----------
    root : Path
        The store directory; the process writes nowhere else.
    storage : Storage
        The store's storage, to remove what a process that died left.
    format : str
        The store's format, one of :data:`FORMATS`.
    """

    def __init__(self, root: Path, storage: Storage, format: str) -> None:
        self.root = root
        self.storage = storage
        self.format = format
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._fds: socket.socket | None = None
        self._sent: set[int] = set()
        self._lock = threading.Lock()
        _STARTED.add(self)

    def _let_go(self) -> None:
        """In a forked child: close this process's copies of the sockets."""
        for end in (self._conn, self._fds):
            if end is not None:
                with contextlib.suppress(OSError):
                    end.close()
        self._conn = self._fds = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """Whether a writer process is running."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process if none runs (it imports torch in its own time)."""
        with self._lock:
            if self.alive:
                return
            self._stop(kill=True)
            messages, theirs = socket.socketpair()
            fds, their_fds = socket.socketpair()
            # the same package as this process's, whatever sys.path the child has
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            code = (
                f"import sys; sys.path.insert(0, {here!r}); "
                "from dp_ckpt_plugin.background.child import main; "
                "sys.exit(main(sys.argv[1:]))"
            )
            passed = (theirs.fileno(), their_fds.fileno())
            argv = [sys.executable, "-c", code, *map(str, passed), str(self.root)]
            with theirs, their_fds:  # the child's ends: closed here once it has them
                self._proc = subprocess.Popen(
                    [*argv, self.format], pass_fds=passed, stdin=subprocess.DEVNULL
                )
            self._sent = set()
            self._conn = Connection(messages.detach())
            self._fds = fds

    def write(
        self,
        path: Path,
        step: int,
        payload: bytes,
        buffers: dict[int, int],
        *,
        durable: bool,
    ) -> tuple[Path, str]:
        """Have the process write ``path``'s payload; return the temporary file and digest.

        ``payload`` is the pickled snapshot, ``buffers`` the shared buffers it
        refers to (ident to memory file descriptor); the process is sent
        those it has not mapped yet.

        Raises
        ------
        CheckpointWriteError
            Naming ``path`` and the cause, also when the process died.
        TypeError
            A value the format refuses.
        """
        self.start()
        new = [(i, fd) for i, fd in buffers.items() if i not in self._sent]
        message = {
            "op": "write",
            "path": str(path),
            "step": step,
            "format": self.format,
            "payload": payload,
            "durable": durable,
            "new": [ident for ident, _ in new],
        }
        try:
            self._conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
            if new:
                sendfds(self._fds, [fd for _, fd in new])
                self._sent.update(i for i, _ in new)
            answer = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            pid = self._proc.pid if self._proc is not None else None
            status = self._stop(kill=True)
            self._remove_leftovers(path, pid)
            raise CheckpointWriteError(
                f"could not write {path}: the writer process ended "
                f"({_status(status)}) before it answered"
            ) from exc
        if answer[0] == "ok":
            return Path(answer[1]), answer[2]
        _, kind, text, code = answer
        if kind == "TypeError":
            raise TypeError(text)
        err = CheckpointWriteError(
            text
            if kind == "CheckpointWriteError"
            else f"could not write {path}: {kind}: {text}"
        )
        err.errno = code
        raise err

    def _remove_leftovers(self, path: Path, pid: int | None) -> None:
        """Remove the temporary file (and linking directory) a dead process left."""
        if pid is None:
            return
        for name, kind in self.storage.names(path.parent):
            if temp_pid(name) == pid and temp_target(name) == path.name:
                remove_leftover(path.parent / name, kind, [], self.storage)

    def close(self) -> None:
        """Stop the process (it finishes nothing: no save is in flight then)."""
        with self._lock:
            self._stop(kill=False)

    def _stop(self, *, kill: bool) -> int | None:
        proc, conn, fds = self._proc, self._conn, self._fds
        self._proc = self._conn = self._fds = None
        status = None
        if proc is not None:
            if not kill and conn is not None:
                with contextlib.suppress(OSError):
                    conn.send_bytes(pickle.dumps({"op": "exit"}))
            try:
                status = proc.wait(timeout=0.5 if kill else CLOSE_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
        for end in (conn, fds):
            if end is not None:
                end.close()
        return status


def _status(code: int | None) -> str:
    if code is None:
        return "status unknown"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


class ProcessPayload:
    """A snapshot that the writer process writes: the store's ``serialize`` for it.

    :func:`~dp_ckpt_plugin.store.commit.write_hashed` calls :meth:`write_in_process`
    instead of writing the payload in this process.
    """

    def __init__(self, process: WriterProcess, snapshots, step: int, snapshot) -> None:
        self.process = process
        self.step = step
        self.payload, self.buffers = snapshots.pickled(snapshot)
        self.snapshot = snapshot  # the buffers stay referenced until written

    def write_in_process(self, path: Path, *, durable: bool) -> tuple[Path, str]:
        """Write ``path``'s payload in the writer process (see :meth:`WriterProcess.write`).

        Called on the background writer's thread once the snapshot's copies
        are done (``BackgroundWriter`` waits for them before the save runs).
        """
        return self.process.write(
            path, self.step, self.payload, self.buffers, durable=durable
        )

    def __call__(self, handle) -> None:
        raise RuntimeError(
            "a snapshot in shared memory is written by the writer process"
        )


#: The ways a background save is written.
WRITERS = ("auto", "process", "thread")
#: The formats the writer process writes (the built-in ones).
FORMATS = ("torch", "hdf5")


def uses_process(writer: str, format_name: str, storage, hooks) -> bool:
    """Whether a store's background saves go to a writer process.

    ``"thread"`` and ``"auto"`` (the default): the store's own thread; the
    figures decided (``docs/performance.md``: with deepmd-kit's small
    checkpoints saved every step, the thread cost less than the process).
    ``"process"``: the writer process, for either built-in format (torch,
    HDF5) when nothing but the built-in formats serializes
    (``on_save_step``) and the store writes through the plain local storage
    on Linux; a store where that is not so is refused with a
    :class:`~dp_ckpt_plugin.errors.ConfigError` naming what stands in the
    way. The environment variable ``DP_CKPT_WRITER`` (``process`` or
    ``thread``) overrides ``"auto"``, for a host (``dp``) that has no option
    for it.
    """
    asked = writer
    if writer == "auto":
        writer = os.environ.get("DP_CKPT_WRITER", "thread") or "thread"
    if writer not in WRITERS or writer == "auto":
        raise ConfigError(
            f"writer must be one of {', '.join(WRITERS)}, got {writer!r}"
            " (DP_CKPT_WRITER: process or thread)"
        )
    if writer == "thread":
        return False
    from ..storage.local import LocalStorage

    origin = "DP_CKPT_WRITER=process" if asked == "auto" else "writer='process'"
    plugins = sorted(
        name
        for name in hooks.serializers()
        if not name.startswith("dp_ckpt_plugin.formats.")
    )
    if format_name not in FORMATS:
        why = f"the format {format_name!r} (it writes {' and '.join(FORMATS)})"
    elif type(storage) is not LocalStorage:
        why = f"the storage {type(storage).__name__} (it writes the local storage)"
    elif plugins:
        why = (
            f"the serializer plugin(s) {', '.join(plugins)} (it runs the built-in ones)"
        )
    elif not hasattr(os, "memfd_create"):
        why = "this system (it needs Linux memfd_create)"
    else:
        return True
    raise ConfigError(
        f"{origin} cannot be used with {why}; use the thread writer (writer='thread')"
    )
