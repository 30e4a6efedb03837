"""The fast payload writer: a checkpoint written by name, hashed while flushed.

:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.write_payload` gives the
serializer a path naming the open temporary file by the payload's final name
(:class:`FinalName`, through ``/proc/self/fd``), remembers the OS error behind
a serializer's own words (:class:`ErrorRecorder`, :func:`os_cause`), and
hashes the written bytes from a map of the file while the fsync runs
(:func:`digest_while`), or beside it with the commit's record
(:func:`digest_beside`); :func:`at_once` runs calls (fsyncs that need no
order between them) on threads of their own together.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from ..errors import CheckpointWriteError
from .temp import temp_name

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Whether an open file can be named by a path (Linux ``/proc/self/fd``).
FD_PATHS = os.path.isdir("/proc/self/fd")
#: Below this size a payload is hashed inline, not beside its fsync.
_INLINE_DIGEST = 4 << 20


def release_frames(exc: BaseException | None) -> None:
    """Free the locals of the finished frames of ``exc`` and the errors behind it.

    A serializer that failed while writing by path keeps its own descriptor
    of the file open as long as its frames live; a disk it filled stays full.
    """
    for link in _chain(exc):
        traceback.clear_frames(link.__traceback__)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors behind it (cause, else context), each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


class _Beside(threading.Thread):
    """``call`` on a thread of its own, started; :meth:`result` joins it and
    raises its error in the caller's thread, or returns its value."""

    def __init__(self, call: Callable[[], object], name: str) -> None:
        super().__init__(name=name)
        self.call = call
        self.value: object = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.call()
        except BaseException as exc:  # raised in the caller's thread
            self.error = exc

    def result(self) -> object:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


def at_once(*calls: Callable[[], object]) -> None:
    """Run ``calls`` at once, each but the last on a thread of its own.

    Returns once every call returned; raises the first error (in the order
    given). For fsyncs that no order is needed between.
    """
    base = threading.current_thread().name
    beside = [
        _Beside(call, f"{base}/dp_ckpt-fsync-{i}") for i, call in enumerate(calls[:-1])
    ]
    last: BaseException | None = None
    try:
        calls[-1]()
    except BaseException as exc:  # raised after the others' errors
        last = exc
    for thread in beside:
        thread.join()
    for thread in beside:
        thread.result()
    if last is not None:
        raise last


def digest_while(fd: int, digest, fsync) -> str:
    """``digest`` of the file open as ``fd``, read from a map of it, while ``fsync`` runs.

    The digest runs on a thread of its own (hashlib and blake3 release the
    GIL) and ``fsync`` on the caller's, so the storage's system calls stay on
    the thread that asked for them. Small files are hashed inline.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        if fsync is not None:
            fsync()
        return digest(memoryview(b""))
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:
        if fsync is None or size < _INLINE_DIGEST:
            if fsync is not None:
                fsync()
            return digest(view)
        hashing = _Beside(lambda: digest(view), "dp_ckpt-digest")
        try:
            fsync()
        finally:
            hashing.join()
        return hashing.result()


class MeanwhileError(Exception):
    """The error of a ``meanwhile`` call, raised as it is by the write."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def digest_beside(fd: int, digest, fsync, tmp: Path, meanwhile) -> str:
    """``digest`` of the file open as ``fd``, then ``meanwhile(tmp, digest)``, beside ``fsync``.

    ``fsync`` runs on a thread of its own from the start; the hash (from a
    read-only map) and ``meanwhile`` run on the caller's thread. Returns once
    both sides are done; the fsync's error first, then ``meanwhile``'s
    (wrapped in ``MeanwhileError``).
    """
    syncing = _Beside(fsync, f"{threading.current_thread().name}/dp_ckpt-fsync")
    try:
        value = digest_while(fd, digest, None)
        try:
            meanwhile(tmp, value)
        except BaseException as exc:
            syncing.result()
            raise MeanwhileError(exc) from None
    finally:
        syncing.join()
    syncing.result()
    return value


class Seams(Protocol):
    """The storage's checked system calls that :class:`FinalName` goes through
    (``LocalStorage``'s, which tests override to inject faults)."""

    def _check(self, path: Path, what: str) -> None: ...
    def _names(self, path: Path, fd: int) -> bool: ...
    def _sys_mkdir(self, path: Path) -> None: ...
    def _sys_link(self, source: Path, dest: Path) -> None: ...
    def _sys_unlink(self, path: Path) -> None: ...
    def _sys_rmdir(self, path: Path) -> None: ...


class FinalName:
    """The open temporary file of a payload, named by the payload's final name.

    ``torch.save`` names the folder inside its zip archive after the file it
    is given (``model.ckpt-30/`` for ``model.ckpt-30.pt``; ``3/`` for
    ``/proc/self/fd/3``). So that a checkpoint is byte for byte the file
    ``torch.save`` to its final path writes, the writer is given a path
    ending in the final name: a hard link to the open temporary file, in a
    new directory of the store with a temporary name (swept like a
    temporary file when a crash leaves it), named through that directory's
    descriptor (``/proc/self/fd/<n>/<final name>``), so that a link planted
    on the way is never followed. The link and the directory go once the
    writer returns, on a thread of their own while the payload is hashed
    and flushed, and before the write returns (:meth:`close_beside`).
    Where no hard link can be made, the open file's own
    ``/proc/self/fd/<n>`` is given (the archive's folder is then named
    after the descriptor).
    """

    def __init__(self, storage: Seams, fd: int, tmp: Path, final: str) -> None:
        self.storage = storage
        self.fd = fd
        self.tmp = tmp
        self.final = final
        self.folder: Path | None = None
        self.dirfd: int | None = None

    def path(self) -> str:
        """Make the link; return the path naming the open file by its final name."""
        folder = self.tmp.parent / temp_name(self.final)
        self.storage._check(folder, "write")
        with contextlib.suppress(OSError):
            self.storage._sys_mkdir(folder)
            self.folder = folder
            self.storage._sys_link(self.tmp, folder / self.final)
            self.dirfd = os.open(
                folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
            )
            if self.storage._names(folder / self.final, self.fd):
                return f"/proc/self/fd/{self.dirfd}/{self.final}"
        self.close()  # no link, or something else is at its name: never write that
        return f"/proc/self/fd/{self.fd}"

    def close_beside(self) -> threading.Thread | None:
        """:meth:`close` on a thread of its own, started; ``None`` if nothing is left."""
        if self.folder is None and self.dirfd is None:
            return None
        thread = threading.Thread(
            target=self.close, name=f"{threading.current_thread().name}/dp_ckpt-tidy"
        )
        thread.start()
        return thread

    def close(self) -> None:
        """Remove the link and its directory (a crash leaves them to the sweep)."""
        folder, self.folder = self.folder, None
        if self.dirfd is not None:
            os.close(self.dirfd)
            self.dirfd = None
        if folder is not None:
            with contextlib.suppress(OSError):
                self.storage._sys_unlink(folder / self.final)
            with contextlib.suppress(OSError):
                self.storage._sys_rmdir(folder)


class ErrorRecorder:
    """A file object that remembers the first OS error its methods raised.

    Serialization libraries report a failed write of the file they were given
    in their own words (h5py: ``Unable to create file (truncated file...)``,
    torch: ``RuntimeError: unexpected pos``), sometimes dropping the original
    error; the store still reports the real cause (``No space left on device``).
    """

    def __init__(self, handle: BinaryIO, named: FinalName | None = None) -> None:
        self._handle = handle
        self.error: OSError | None = None
        self._named = named
        self._path: str | None = None

    @property
    def os_path(self) -> str | None:
        """A path naming the open file, for a writer to write by name, or None.

        Made on first use (:class:`FinalName`): a writer that never asks
        for it (h5py) costs nothing.
        """
        if self._path is None and self._named is not None:
            self._path = self._named.path()
        return self._path

    @property
    def named(self) -> bool:
        """Whether the writer was given a path (:attr:`os_path` was asked for)."""
        return self._path is not None

    def forget_path(self) -> None:
        """Give no path from now on: the writer writes through the file object."""
        self._named = None
        self._path = None

    def write(self, data) -> int:
        """Write to the file, remembering an OS error (the hot path: no wrapper)."""
        try:
            return self._handle.write(data)
        except OSError as exc:
            self._note(exc)
            raise

    def _note(self, exc: OSError) -> None:
        if self.error is None and exc.errno is not None:
            self.error = exc

    def __getattr__(self, name: str):
        attr = getattr(self._handle, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except OSError as exc:
                self._note(exc)
                raise

        return call


def os_cause(exc: BaseException) -> OSError | None:
    """Return the OS error behind ``exc``, looking through wrapping errors.

    Serialization libraries wrap the error of a failed write in their own:
    h5py raises ``OSError("File close failed")`` without an errno, torch a
    ``RuntimeError``; the ``ENOSPC`` or ``EIO`` may be further down the chain.
    """
    first = None
    for link in _chain(exc):
        if isinstance(link, CheckpointWriteError):
            return None
        if isinstance(link, OSError):
            if link.errno is not None:
                return link
            first = first or link
    return first
