"""The storage layer: the only code that touches the file system.

Every open, read, write, rename, link, listing, fsync and removal the core
makes goes through a :class:`Storage`. The store, its records, pointers,
manifest, archive, quarantine, lock and sweep, resolution and the
``dp-ckpt`` commands say *what* to do; the storage decides *how* a file is
touched, once, for all of them:

- a write never follows a symbolic link: new files are created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a temporary name and renamed onto
  their name (a rename replaces a link, never writes through it);
- small files (commit records, pointers, the manifest, the lock's holder
  note) are read only when they are regular files, never through a link,
  without blocking (a FIFO, device or socket where a file is expected is
  reported, not opened) and at most :data:`SMALL_FILE_LIMIT` bytes;
- a storage made for a store (``root``) creates, changes, moves or removes
  nothing outside that directory, whatever links lie in it, except the
  mirrors it is told of (a host's compatibility pointer and alias);
- a checkpoint that is loaded is read whole from one opening
  (:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.read_payload`): what is verified is what is loaded;
- the single-writer lock (``flock``) is taken and given up here
  (:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.lock_file`, :meth:`~dp_ckpt_plugin.storage.local.LocalStorage.unlock_file`);
- every fsync is counted in one place (``counts``), so a
  benchmark or a test can say how many a save makes.

A mutating call that fails raises
:class:`~dp_ckpt_plugin.errors.CheckpointWriteError` naming the path and the
cause; a read of a file that is not what it should be raises
:class:`~dp_ckpt_plugin.errors.UnreadableFileError`.

:class:`~dp_ckpt_plugin.storage.local.LocalStorage` is the POSIX
implementation. What another one (an object store) would have to provide is
in ``docs/architecture.md``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol, runtime_checkable

from ..errors import UnreadableFileError

#: Most bytes a record, pointer, manifest or holder note may hold.
SMALL_FILE_LIMIT = 1 << 20


class Entry(NamedTuple):
    """What a name is, as ``lstat`` (or ``stat``, following links) says.

    ``kind`` is ``file``, ``dir``, ``link``, ``fifo``, ``socket``, ``device``
    or ``other``; ``size`` the size in bytes, ``mtime_ns`` the modification
    time, and ``dev`` and ``ino`` the file's identity.
    """

    kind: str
    size: int
    mtime_ns: int
    dev: int
    ino: int

    @property
    def is_file(self) -> bool:
        """Whether it is a regular file."""
        return self.kind == "file"

    @property
    def is_dir(self) -> bool:
        """Whether it is a directory."""
        return self.kind == "dir"


class PayloadBytes(NamedTuple):
    """A checkpoint file read whole, from one opening: its ``path``, its
    content (``data``) and what the opened file was (``entry``, the
    ``fstat`` of the open descriptor).

    What the front door verifies and what every loader reads are these bytes:
    a file replaced at ``path`` after they were read is never loaded in
    their place.
    """

    path: Path
    data: bytes
    entry: Entry

    @property
    def size(self) -> int:
        """The number of bytes read."""
        return len(self.data)

    def reader(self) -> BinaryIO:
        """A binary file object reading these bytes from 0 (no copy)."""
        return io.BytesIO(self.data)


@runtime_checkable
class Storage(Protocol):
    """What the core needs from a file system.

    Paths are absolute :class:`~pathlib.Path` objects. See
    :class:`~dp_ckpt_plugin.storage.local.LocalStorage` for the contract of
    each method.
    """

    root: Path | None

    # -- reading ------------------------------------------------------------
    def entry(self, path: Path, *, follow: bool = False) -> Entry | None: ...

    def names(self, directory: Path) -> list[tuple[str, str]]: ...

    def read_small(self, path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes | None: ...

    def link_target(self, path: Path) -> str | None: ...

    def real(self, path: Path) -> Path: ...

    def open_payload(self, path: Path) -> BinaryIO: ...

    def map_payload(self, path: Path) -> AbstractContextManager[memoryview]: ...

    def read_payload(self, path: Path) -> PayloadBytes: ...

    def free_bytes(self, directory: Path) -> int | None: ...

    def writable(self, directory: Path) -> bool: ...

    # -- writing ------------------------------------------------------------
    def write_temp(
        self, path: Path, writer: Callable[[BinaryIO], object], *, durable: bool
    ) -> Path: ...

    def write_payload(
        self,
        path: Path,
        writer: Callable[[BinaryIO], object],
        *,
        durable: bool,
        digest: Callable[[memoryview], str],
        meanwhile: Callable[[Path, str], object] | None = None,
    ) -> tuple[Path, str]: ...

    def move_into_place(self, tmp: Path, path: Path, *, durable: bool) -> None: ...

    def rename(self, source: Path, dest: Path) -> bool: ...

    def write_atomic(
        self, path: Path, data: bytes, *, durable: bool, sync_dir: bool = True
    ) -> None: ...

    def make_link(
        self, path: Path, target: str, *, durable: bool, sync_dir: bool = True
    ) -> str: ...

    def remove(self, path: Path) -> bool: ...

    def remove_quietly(self, path: Path) -> None: ...

    def sync_dir(self, directory: Path, *, holding: Iterable[Path] = ()) -> None: ...

    def make_dirs(self, directory: Path, *, durable: bool) -> None: ...

    def make_dir(self, path: Path, *, durable: bool) -> bool: ...

    def remove_dir(self, path: Path) -> bool: ...

    def lock_file(self, path: Path) -> object | None: ...

    def unlock_file(self, held: object) -> None: ...


def local_storage(
    root: str | os.PathLike | None = None, *, mirrors: Iterable[Path] = ()
) -> Storage:
    """The POSIX storage, confined to ``root`` (and ``mirrors``) when given."""
    from .local import LocalStorage

    return LocalStorage(root, mirrors=mirrors)


def default_storage() -> Storage:
    """An unconfined POSIX storage, for readers with no store of their own."""
    return local_storage()


def entry_or_none(
    path: Path, *, follow: bool = False, storage: Storage | None = None
) -> Entry | None:
    """What ``path`` is (``Storage.entry``), or ``None`` when absent or unreadable.

    For a question that has no answer to give about a name the system
    refuses to describe: "is it a directory?" is then "no".
    """
    try:
        return (storage or default_storage()).entry(path, follow=follow)
    except UnreadableFileError:
        return None


def is_file(path: Path, *, storage: Storage | None = None) -> bool:
    """Whether ``path`` is an existing file (links followed), as the storage sees it."""
    found = entry_or_none(path, follow=True, storage=storage)
    return found is not None and found.is_file


def entries_of(directory: Path, storage: Storage) -> list[tuple[str, str]]:
    """``storage.names(directory)``, or nothing when it cannot be listed."""
    try:
        return storage.names(directory)
    except UnreadableFileError:
        return []
