"""An object store emulated on a directory, for the tests.

:class:`DirectoryStorage` is the POSIX storage of the package with the object
protocol on top: keys are paths under its root, ``put_if_absent`` is a hard
link (whole or not at all), ``put_if_match`` and ``delete`` hold the
``flock`` of a lock file beside the object, and a version is the file's
inode, size and modification time. No production path uses it: it is the
conformance suite's directory case and a remote store the tests can look
into with ``ls``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dp_ckpt_plugin.errors import CheckpointWriteError
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.storage.local import _fail as fail
from dp_ckpt_plugin.storage.objects import (
    SMALL_OBJECT_LIMIT,
    Capabilities,
    KeyExistsError,
    KeyMissingError,
    ObjectInfo,
    ObjectTooLargeError,
    Source,
    VersionMismatchError,
    check_key,
    check_prefix,
)
from dp_ckpt_plugin.storage.temp import temp_target

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class DirectoryStorage(LocalStorage):
    """The objects of a directory (``root``), keys relative to it."""

    #: What the directory enforces as an object storage.
    capabilities = Capabilities(
        create_if_absent=True, compare_and_swap=True, durable_put=True
    )

    def _sys_flock_object(self, fd: int, path: Path) -> None:
        """Take the exclusive ``flock`` of an object's lock file (blocking)."""
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _sys_set_mtime(self, fd: int, mtime_ns: int) -> None:
        """Stamp a new object's modification time (part of its version)."""
        os.utime(fd, ns=(mtime_ns, mtime_ns))

    @property
    def url(self) -> str:
        """The root, as object keys are relative to it."""
        return str(self._object_root())

    def _object_root(self) -> Path:
        if self.root is None:
            raise CheckpointWriteError(
                "this storage has no root directory: object keys need one"
            )
        return self.root

    def url_of(self, key: str) -> str:
        """The path of the object at ``key``, as text."""
        return str(self._object_path(key))

    def _object_path(self, key: str) -> Path:
        check_key(key)
        name = key.rpartition("/")[2]
        if temp_target(name) is not None or _is_object_lock(name):
            raise ValueError(f"not an object key (a name this storage uses): {key!r}")
        return self._object_root() / key

    def _object_info(self, key: str, st: os.stat_result) -> ObjectInfo:
        version = f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
        return ObjectInfo(key, st.st_size, version, st.st_mtime_ns / 1e9)

    @contextlib.contextmanager
    def _object_lock(self, path: Path) -> Iterator[None]:
        """Hold the ``flock`` of the lock file beside ``path``.

        The lock file is checked to still be the one at its name once held
        (a deleting writer removes it), else taken again.
        """
        lock = path.parent / _object_lock_name(path.name)
        while True:
            fd = self._open_lock(lock)
            try:
                try:
                    self._sys_flock_object(fd, lock)
                except OSError as exc:
                    raise fail("lock", path, exc) from exc
                if self._names(lock, fd):
                    yield
                    return
            finally:
                os.close(fd)

    def _new_object(self, path: Path, data: Source, *, after_ns: int = 0) -> Path:
        """Write ``data`` under a temporary name beside ``path``, durably, stamped.

        Its modification time is the clock's in nanoseconds (and later than
        ``after_ns``), so that two objects written in one clock tick of the
        file system still differ in version.
        """

        def write(handle: BinaryIO) -> None:
            if isinstance(data, (bytes, bytearray, memoryview)):
                handle.write(data)
            else:
                shutil.copyfileobj(data, handle, _COPY_CHUNK)
            handle.flush()
            stamp = max(time.time_ns(), after_ns + 1)
            self._sys_set_mtime(handle.fileno(), stamp)

        return self.write_temp(path, write, durable=True)

    def _make_parent(self, path: Path) -> None:
        if self.entry(path.parent, follow=True) is None:
            self.make_dirs(path.parent, durable=True)

    def _stat_object(self, path: Path) -> os.stat_result | None:
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise fail("look up", path, exc) from exc
        return st if stat.S_ISREG(st.st_mode) else None

    def put(self, key: str, data: Source) -> ObjectInfo:
        """Write a whole object, replacing any (temporary file, fsync, rename)."""
        path = self._object_path(key)
        self._check(path, "write")
        self._make_parent(path)
        with self._object_lock(path):
            old = self._stat_object(path)
            tmp = self._new_object(path, data, after_ns=old.st_mtime_ns if old else 0)
            st = os.lstat(tmp)
            self.move_into_place(tmp, path, durable=True)
        return self._object_info(key, st)

    def put_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        """Create an object if its key is free (a hard link: whole or not at all)."""
        path = self._object_path(key)
        self._check(path, "write")
        self._make_parent(path)
        tmp = self._new_object(path, data)
        try:
            st = os.lstat(tmp)
            self._sys_link(tmp, path)
        except FileExistsError:
            raise KeyExistsError(self.url_of(key)) from None
        except OSError as exc:
            raise fail("create", path, exc) from exc
        finally:
            self.remove_quietly(tmp)
        self.sync_dir(path.parent, holding=[path])
        return self._object_info(key, st)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace an object still at ``version`` (under its lock file's ``flock``)."""
        path = self._object_path(key)
        self._check(path, "write")
        if self._stat_object(path) is None:
            raise VersionMismatchError(self.url_of(key))
        with self._object_lock(path):
            old = self._stat_object(path)
            if old is None or self._object_info(key, old).version != version:
                raise VersionMismatchError(self.url_of(key))
            tmp = self._new_object(path, data, after_ns=old.st_mtime_ns)
            st = os.lstat(tmp)
            self.move_into_place(tmp, path, durable=True)
        return self._object_info(key, st)

    def _open_object(self, key: str) -> tuple[int, os.stat_result] | None:
        """Open a regular file at ``key`` for reading (no link followed), or ``None``."""
        path = self._object_path(key)
        self._check(path, "read")
        try:
            fd = self._sys_open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                return None
            raise fail("read", path, exc) from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return fd, st

    def get(
        self, key: str, limit: int = SMALL_OBJECT_LIMIT
    ) -> tuple[bytes, ObjectInfo] | None:
        """A small object and its version (of the same file); ``None`` when absent."""
        opened = self._open_object(key)
        if opened is None:
            return None
        fd, st = opened
        if st.st_size > limit:
            os.close(fd)
            raise ObjectTooLargeError(self.url_of(key), st.st_size, limit)
        try:
            data = read_at(fd, 0, st.st_size)
        except OSError as exc:
            raise fail("read", self.url_of(key), exc) from exc
        finally:
            os.close(fd)
        self.count("small_read")
        self.count("small_bytes", len(data))
        return data, self._object_info(key, st)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of an object (fewer at its end)."""
        if start < 0 or end < start:
            raise ValueError(f"not a byte range: {start} to {end}")
        opened = self._open_object(key)
        if opened is None:
            raise KeyMissingError(self.url_of(key))
        fd, st = opened
        try:
            return read_at(fd, start, max(0, min(end, st.st_size) - start))
        except OSError as exc:
            raise fail("read", self.url_of(key), exc) from exc
        finally:
            os.close(fd)

    def download(self, key: str, sink: BinaryIO) -> ObjectInfo:
        """Copy an object into ``sink`` in chunks; return what it was."""
        opened = self._open_object(key)
        if opened is None:
            raise KeyMissingError(self.url_of(key))
        fd, st = opened
        try:
            done = 0
            while done < st.st_size:
                chunk = os.pread(fd, min(_COPY_CHUNK, st.st_size - done), done)
                if not chunk:
                    break
                sink.write(chunk)
                done += len(chunk)
        except OSError as exc:
            raise fail("read", self.url_of(key), exc) from exc
        finally:
            os.close(fd)
        return self._object_info(key, st)

    def head(self, key: str) -> ObjectInfo | None:
        """What the regular file at ``key`` is, or ``None``."""
        path = self._object_path(key)
        self._check(path, "read")
        st = self._stat_object(path)
        return None if st is None else self._object_info(key, st)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """The objects whose keys start with ``prefix`` (any string), by key.

        Temporary files, lock files, links and anything but regular files
        are not objects.
        """
        check_prefix(prefix)
        root = self._object_root()
        folder = prefix.rpartition("/")[0]
        found: list[ObjectInfo] = []
        pending = [folder] if folder else [""]
        while pending:
            base = pending.pop()
            for name, kind in self.names(root / base if base else root):
                key = f"{base}/{name}" if base else name
                if not (key.startswith(prefix) or prefix.startswith(key + "/")):
                    continue
                if kind == "dir":
                    pending.append(key)
                elif kind == "file" and not (
                    temp_target(name) is not None or _is_object_lock(name)
                ):
                    st = self._stat_object(root / key)
                    if st is not None and key.startswith(prefix):
                        found.append(self._object_info(key, st))
        return iter(sorted(found, key=lambda info: info.key))

    def delete(self, key: str) -> bool:
        """Remove an object (and its lock file); ``False`` if it was not there."""
        path = self._object_path(key)
        self._check(path, "remove")
        if self._stat_object(path) is None:
            return False
        with self._object_lock(path):
            gone = self._stat_object(path) is not None and self.remove(path)
            self.remove_quietly(path.parent / _object_lock_name(path.name))
        if gone:
            self.sync_dir(path.parent, holding=[path])
        return gone


#: Bytes copied at a time into or out of an object.
_COPY_CHUNK = 1 << 20
_OBJECT_LOCK_SUFFIX = ".dp_ckpt-lock"


def _object_lock_name(name: str) -> str:
    return f".{name}{_OBJECT_LOCK_SUFFIX}"


def _is_object_lock(name: str) -> bool:
    return name.startswith(".") and name.endswith(_OBJECT_LOCK_SUFFIX)


def read_at(fd: int, start: int, size: int) -> bytes:
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, start + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)
