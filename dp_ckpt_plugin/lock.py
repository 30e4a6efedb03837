"""The single-writer lock of a checkpoint directory.

The lock is an OS file lock (``filelock``), so the kernel releases it when its
holder dies, even by SIGKILL: a lock left behind never blocks. Beside it, a
small JSON file names the holder (host, pid, command, start time) so that the
refusal can say who holds the directory.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import StoreLockedError
from .fsio import write_text_atomic
from .layout import HOLDER_NAME, LOCK_NAME


class StoreLock:
    """Exclusive right to write one checkpoint directory.

    Parameters
    ----------
    directory : Path
        The store directory; it must exist.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = FileLock(
            str(self.directory / LOCK_NAME), timeout=0, thread_local=False
        )

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._lock.is_locked

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLockedError` naming the holder."""
        if self._lock.is_locked:
            return
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise StoreLockedError(
                f"checkpoint directory {self.directory} is in use by another run "
                f"({self.describe_holder()}); wait for it to finish or choose another save_dir"
            ) from None
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "command": " ".join(sys.argv),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_text_atomic(
            self.directory / HOLDER_NAME, json.dumps(holder) + "\n", durable=False
        )

    def describe_holder(self) -> str:
        """Say who holds the lock, as far as the holder file tells."""
        try:
            info = json.loads((self.directory / HOLDER_NAME).read_text())
            return f"pid {info['pid']} on {info['host']}, since {info['since']}: {info['command']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._lock.is_locked:
            self._lock.release(force=True)

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
