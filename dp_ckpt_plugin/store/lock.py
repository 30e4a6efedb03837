"""The single-writer lock of a checkpoint directory.

The lock is an OS file lock, taken and given up by the storage
(:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.lock_file`: ``flock`` on POSIX,
``filelock`` elsewhere), so the kernel releases it when its holder dies, even
by SIGKILL: a lock left behind never blocks. Beside it, a small JSON file
names the holder (host, pid, command, start time) so that the refusal can say
who holds the directory.

Releasing removes both files, so a run that ends (or fails to start) leaves
none behind. The storage removes the lock file while it is still locked, and
a writer that locks a file checks afterwards that the file is still the one
at the lock's path: a file removed by a releasing holder between another
writer's ``open`` and its ``flock`` is never taken for the lock.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from ..checkpoint.layout import HOLDER_NAME, LOCK_NAME
from ..checkpoint.records import load_json, shorten
from ..errors import CheckpointWriteError, StoreLockedError
from ..storage import Storage, local_storage


class StoreLock:
    """Exclusive right to write one checkpoint directory.

    Parameters
    ----------
    directory : Path
        The store directory; it must exist.
    storage : Storage, optional
        How the lock and holder files are touched (confined to ``directory``
        by default).
    """

    def __init__(self, directory: Path, *, storage: Storage | None = None) -> None:
        self.directory = Path(directory)
        self.storage = storage or local_storage(self.directory)
        self.path = self.directory / LOCK_NAME
        self._held: object | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._held is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLockedError` naming the holder."""
        if self.held:
            return
        self._held = self.storage.lock_file(self.path)
        if self._held is None:
            raise StoreLockedError(
                f"checkpoint directory {self.directory} is in use by another run "
                f"({self.describe_holder()}); wait for it to finish or choose another save_dir"
            )
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": " ".join(sys.argv),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        note = (json.dumps(holder) + "\n").encode("utf-8")
        try:
            self.storage.write_atomic(self.directory / HOLDER_NAME, note, durable=False)
        except CheckpointWriteError:
            self.release()
            raise

    def describe_holder(self) -> str:
        """Say who holds the lock, as far as the holder file tells."""
        try:
            data = self.storage.read_small(self.directory / HOLDER_NAME, 64 * 1024)
            info = load_json(data.decode("utf-8"), HOLDER_NAME, "holder note")
            fields = [info[k] for k in ("pid", "host", "since", "command")]
        except Exception:  # an unreadable note is no reason to fail a refusal
            return "holder unknown"
        pid, host, since, command = (
            shorten(f, 200) if not isinstance(f, str) else f[:200] for f in fields
        )
        return f"pid {pid} on {host}, since {since}: {command}"

    def release(self) -> None:
        """Give the lock up and remove its files (idempotent)."""
        if not self.held:
            return
        self.storage.remove_quietly(self.directory / HOLDER_NAME)
        held, self._held = self._held, None
        self.storage.unlock_file(held)  # removes the lock file, then releases

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
