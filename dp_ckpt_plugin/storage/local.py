"""The POSIX storage: atomic, durable, link-safe file operations.

Every write follows one pattern: create a new temporary name in the
destination directory (``O_CREAT | O_EXCL | O_NOFOLLOW``: never an existing
file, never through a link), write, flush and fsync it, ``os.replace`` it onto
the final name, then fsync the directory. A failure at any step removes the
temporary file and raises :class:`~dp_ckpt_plugin.errors.CheckpointWriteError`
naming the path and the cause, leaving whatever the final name held untouched.

The system calls are made by the small ``_sys_*`` methods and nowhere else, so
that a test can record them (the crash-state explorer) or make one fail (the
fault injectors) by overriding those methods in a subclass.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ..errors import CheckpointWriteError, UnreadableFileError, describe_os_error
from . import SMALL_FILE_LIMIT, Entry, PayloadBytes
from .payload import (
    FD_PATHS,
    ErrorRecorder,
    FinalName,
    MeanwhileError,
    digest_beside,
    digest_while,
    os_cause,
    release_frames,
)
from .temp import temp_name, temp_target

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

#: Errors meaning "this filesystem makes no symlinks", not "something broke".
_NO_SYMLINK_ERRNOS = frozenset(
    {errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: A new file: never an existing one, never through a link.
_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
#: Times a lock whose file vanished under it is tried again before giving up.
_LOCK_ATTEMPTS = 5
_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "link"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "device"),
    (stat.S_ISBLK, "device"),
)
_A_KIND = {
    "dir": "a directory",
    "link": "a symbolic link",
    "fifo": "a FIFO",
    "socket": "a socket",
    "device": "a device",
    "other": "not a regular file",
}


def _entry(st: os.stat_result) -> Entry:
    kind = next((kind for test, kind in _KINDS if test(st.st_mode)), "other")
    return Entry(kind, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)


def _listed_kind(entry: os.DirEntry) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _unreadable(path: object, what: str, exc: OSError) -> UnreadableFileError:
    return UnreadableFileError(path, f"cannot be {what}: {describe_os_error(exc)}")


def _fail(what: str, path: object, exc: BaseException) -> CheckpointWriteError:
    err = CheckpointWriteError(f"could not {what} {path}: {describe_os_error(exc)}")
    if isinstance(exc, OSError):
        err.errno = exc.errno
    return err


class LocalStorage:
    """Files on a local (POSIX) file system.

    Parameters
    ----------
    root : str or Path, optional
        The store directory. When given, every change lands inside it (its
        real path, links resolved), or on one of ``mirrors``; anything else is
        refused with :class:`~dp_ckpt_plugin.errors.CheckpointWriteError`.
    mirrors : iterable of Path
        Files outside ``root`` this storage may write (and their temporary
        names): a host's compatibility pointer and alias.
    """

    def __init__(
        self, root: str | os.PathLike | None = None, *, mirrors: Iterable[Path] = ()
    ) -> None:
        self.root = Path(os.path.abspath(root)) if root is not None else None
        self.mirrors = {Path(os.path.abspath(m)) for m in mirrors}
        #: How many times each kind of call was made (``fsync``, ``fsync_dir``,
        #: ``small_read``, ``small_bytes``, ``payload_open``, ...).
        self.counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to :attr:`counts` ``[what]``."""
        with self._count_lock:
            self.counts[what] += n

    # -- the system calls (one method each, for tests to override) ------------
    def _sys_open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def _sys_fsync(self, fd: int, path: Path) -> None:
        self.count("fsync")
        os.fsync(fd)

    def _sys_fsync_dir(self, directory: Path) -> None:
        self.count("fsync_dir")
        fd = os.open(directory, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _sys_rename(self, source: Path, dest: Path) -> None:
        os.replace(source, dest)

    def _sys_unlink(self, path: Path) -> None:
        os.unlink(path)

    def _sys_mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def _sys_rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def _sys_symlink(self, target: str, path: Path) -> None:
        os.symlink(target, path)

    def _sys_link(self, source: Path, dest: Path) -> None:
        os.link(source, dest, follow_symlinks=False)

    def _sys_flock(self, fd: int, path: Path) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _wrap_handle(self, handle: BinaryIO, path: Path) -> BinaryIO:
        """The file object a writer gets (a test may wrap it to fail writes)."""
        return handle

    # -- containment ------------------------------------------------------------
    def contains(self, path: Path) -> bool:
        """Whether this storage may change ``path`` (see the class docs)."""
        if self.root is None:
            return True
        path = Path(os.path.abspath(path))
        if path in self.mirrors:
            return True
        target = temp_target(path.name)
        if target is not None and path.parent / target in self.mirrors:
            return True
        parent = Path(os.path.realpath(path.parent))
        return parent.is_relative_to(os.path.realpath(self.root))

    def _check(self, path: Path, what: str) -> None:
        if not self.contains(path):
            raise CheckpointWriteError(
                f"refusing to {what} {path}: it lies outside the checkpoint "
                f"directory {self.root} (a link in it leads elsewhere)"
            )

    # -- reading -----------------------------------------------------------------
    def entry(self, path: Path, *, follow: bool = False) -> Entry | None:
        """What ``path`` is (``None`` when absent); ``follow`` follows links.

        A link that dangles or loops is ``None`` with ``follow``.

        Raises
        ------
        UnreadableFileError
            When the system refuses to say (``EACCES``, ``EIO``).
        """
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if follow and exc.errno == errno.ELOOP:
                return None
            raise _unreadable(path, "read", exc) from None
        return _entry(st)

    def names(self, directory: Path) -> list[tuple[str, str]]:
        """The entries of ``directory`` as ``(name, kind)``, links not followed.

        Empty when ``directory`` is absent or not a directory.

        Raises
        ------
        UnreadableFileError
            When it cannot be listed (``EACCES``, ``EIO``).
        """
        try:
            with os.scandir(directory) as entries:
                return [(entry.name, _listed_kind(entry)) for entry in entries]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise _unreadable(directory, "listed", exc) from None

    def read_small(self, path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes | None:
        """The content of a small regular file; ``None`` when absent.

        Never opens anything but a regular file (no link is followed, no FIFO
        or device opened) and reads at most ``limit`` bytes.

        Raises
        ------
        UnreadableFileError
            When it is not a regular file, is larger than ``limit``, or
            cannot be read.
        """
        fd = self._open_file(path, _NOFOLLOW, follow=False, limit=limit)
        if fd is None:
            return None
        try:
            data = b""
            while len(data) <= limit:
                chunk = os.read(fd, limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk  # the first chunk itself: no copy
        except OSError as exc:
            raise _unreadable(path, "read", exc) from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise UnreadableFileError(path, f"holds more than the {limit} bytes it may")
        self.count("small_read")
        self.count("small_bytes", len(data))
        return data

    def _open_file(
        self, path: Path, flags: int, *, follow: bool, limit: int | None = None
    ) -> int | None:
        """Open the regular file at ``path`` to read; ``None`` when it is absent.

        Raises :class:`UnreadableFileError` when it is no regular file (or
        holds more than ``limit`` bytes), cannot be opened, or is another
        file once opened (``follow``: no longer a regular file).
        """
        found = self.entry(path, follow=follow)
        if found is None:
            return None
        if not found.is_file:
            raise UnreadableFileError(path, f"is {_A_KIND[found.kind]}, not a file")
        if limit is not None and found.size > limit:
            raise UnreadableFileError(
                path, f"holds {found.size} bytes, more than the {limit} it may"
            )
        try:
            fd = self._sys_open(path, os.O_RDONLY | flags | _NONBLOCK | _CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unreadable(path, "read", exc) from None
        try:
            now = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise _unreadable(path, "read", exc) from None
        if not stat.S_ISREG(now.st_mode) or (
            not follow and (now.st_dev, now.st_ino) != (found.dev, found.ino)
        ):
            os.close(fd)
            raise UnreadableFileError(path, "changed while it was opened")
        return fd

    def link_target(self, path: Path) -> str | None:
        """A symbolic link's target as written, or ``None`` if it is no link."""
        try:
            return os.readlink(path)
        except OSError:
            return None

    def real(self, path: Path) -> Path:
        """``path`` with every link resolved (as far as they resolve)."""
        return Path(os.path.realpath(path))

    def open_payload(self, path: Path) -> BinaryIO:
        """Open a checkpoint file for reading; only a regular file is opened.

        Raises
        ------
        FileNotFoundError
            When it is gone.
        UnreadableFileError
            When it is not a regular file or cannot be opened.
        """
        fd = self._open_file(path, 0, follow=True)
        if fd is None:
            raise FileNotFoundError(
                errno.ENOENT, "No such file or directory", str(path)
            )
        os.set_blocking(fd, True)
        self.count("payload_open")
        return os.fdopen(fd, "rb")

    @contextlib.contextmanager
    def map_payload(self, path: Path) -> Iterator[memoryview]:
        """A checkpoint file mapped read-only: its bytes in the page cache, no copy.

        Opened as :meth:`open_payload` opens it (a regular file only); the
        view is released and the map closed when the block ends. Counted:
        ``payload_map``. Raises as :meth:`open_payload` does.
        """
        with self.open_payload(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                yield memoryview(b"")
                return
            try:
                mapped = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ)
            except OSError as exc:
                raise _unreadable(path, "read", exc) from None
        self.count("payload_map")
        try:
            with memoryview(mapped) as view:
                yield view
        finally:
            with contextlib.suppress(BufferError):  # a slice still held: freed with it
                mapped.close()

    def read_payload(self, path: Path) -> PayloadBytes:
        """Read a checkpoint file whole: one opening, one pass over its bytes.

        Opened as :meth:`open_payload` opens it (a regular file only). The
        bytes are what the front door verifies and what every loader reads,
        so a file replaced at ``path`` afterwards is never loaded unverified.
        Counted: ``payload_read`` and ``payload_bytes``.

        Raises
        ------
        FileNotFoundError
            When it is gone.
        UnreadableFileError
            When it is not a regular file or cannot be read.
        """
        with self.open_payload(path) as handle:
            try:
                found = _entry(os.fstat(handle.fileno()))
                data = handle.read()
            except OSError as exc:
                raise _unreadable(path, "read", exc) from None
        self.count("payload_read")
        self.count("payload_bytes", len(data))
        return PayloadBytes(Path(path), data, found)

    def free_bytes(self, directory: Path) -> int | None:
        """The bytes available to this user under ``directory``, if known."""
        try:
            return shutil.disk_usage(directory).free
        except OSError:
            return None

    def writable(self, directory: Path) -> bool:
        """Whether this process may create entries in ``directory``."""
        return os.access(directory, os.W_OK | os.X_OK)

    # -- writing -----------------------------------------------------------------
    def write_temp(
        self, path: Path, writer: Callable[[BinaryIO], object], *, durable: bool
    ) -> Path:
        """Write a file through ``writer`` under a new temporary name beside ``path``.

        Returns the temporary path, its content flushed (and fsynced if
        ``durable``). Any failure of the writer, a format's own errors
        included (``torch.save`` raises ``RuntimeError`` on a full disk),
        removes the temporary file and raises :class:`CheckpointWriteError`
        naming ``path`` and the cause; a :class:`TypeError` (a value the
        format refuses) is passed on as it is.
        """
        return self._write(path, writer, durable=durable, digest=None)[0]

    def write_payload(
        self,
        path: Path,
        writer: Callable[[BinaryIO], object],
        *,
        durable: bool,
        digest: Callable[[memoryview], str],
        meanwhile: Callable[[Path, str], object] | None = None,
    ) -> tuple[Path, str]:
        """Write a checkpoint under a temporary name; return it and its digest.

        As :meth:`write_temp`, for a payload: the file object ``writer`` gets
        also carries ``os_path``, a path naming the open temporary file by
        the payload's final name (see ``storage.payload.FinalName``), when the system has
        one (``/proc/self/fd``) and nothing interposes on the writes, so
        that a serializer faster with a path than with a Python file object
        (``torch.save``) writes by name into the file this storage created
        (``O_EXCL | O_NOFOLLOW``: a name planted meanwhile is never
        written), and one that records the name (``torch.save`` names its
        archive's folder after it) writes what it writes to the final path.
        A write by path that fails
        without an OS error (``torch.save`` words its own) is done again
        through the file object, which reports the cause.

        Once written, ``digest`` reads the bytes where they are, in the page
        cache (a read-only map of the file, no copy), on a thread of its own
        while this one waits for the fsync: hashing and flushing overlap.

        With ``meanwhile`` (and ``durable``), the fsync of the payload runs
        on a thread of its own from the moment the file is written; this
        thread hashes it, then calls ``meanwhile(tmp, digest)`` (the commit
        writes its record and makes it durable there), and returns once both
        are done: the payload's fsync overlaps the hash and the record's
        fsyncs. An error of ``meanwhile`` is raised as it is.
        """
        return self._write(
            path, writer, durable=durable, digest=digest, meanwhile=meanwhile
        )

    def sync_file(self, path: Path) -> None:
        """Make the data of the file at ``path`` durable (an fsync through a new descriptor)."""
        try:
            fd = self._sys_open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except OSError as exc:
            raise _fail("open to fsync", path, exc) from exc
        try:
            self._sys_fsync(fd, path)
        except OSError as exc:
            raise _fail("fsync", path, exc) from exc
        finally:
            os.close(fd)

    def _write(
        self, path: Path, writer, *, durable: bool, digest, meanwhile=None
    ) -> tuple:
        tmp = path.parent / temp_name(path.name)
        self._check(tmp, "write")
        step = "create"
        recorder = None
        found = None
        named = None
        try:
            fd = self._sys_open(tmp, _NEW)
            with os.fdopen(fd, "w+b") as handle:
                step = "write"
                wrapped = self._wrap_handle(handle, tmp)
                if digest is not None and wrapped is handle and FD_PATHS:
                    named = FinalName(self, fd, tmp, path.name)
                recorder = ErrorRecorder(wrapped, named)
                try:
                    writer(recorder)
                except Exception as exc:
                    if (
                        not recorder.named
                        or isinstance(exc, TypeError)
                        or os_cause(exc) is not None
                    ):
                        raise
                    release_frames(exc)  # the failed writer's own descriptor
                    del exc
                    # the serializer wrote by path and said why in its own
                    # words: write again through the file, which names the cause
                    handle.seek(0)
                    handle.truncate()
                    recorder.forget_path()
                    writer(recorder)
                # the naming folder goes on a thread of its own while this
                # one hashes and flushes the payload (a removal of a folder
                # costs milliseconds on some disks); gone before returning
                tidy = named.close_beside() if named is not None else None
                try:
                    handle.flush()
                    if digest is None:
                        if durable:
                            step = "fsync"
                            self._sys_fsync(fd, tmp)
                    else:
                        step = "fsync"
                        fsync = (lambda: self._sys_fsync(fd, tmp)) if durable else None
                        if meanwhile is not None and fsync is not None:
                            found = digest_beside(fd, digest, fsync, tmp, meanwhile)
                        else:
                            found = digest_while(fd, digest, fsync)
                finally:
                    if tidy is not None:
                        tidy.join()
        except BaseException as exc:
            if named is not None:
                named.close()  # idempotent: nothing left if the tidy ran
            if step != "create":
                self.remove_quietly(tmp)
            if isinstance(exc, MeanwhileError):
                raise exc.error from None
            cause = os_cause(exc)
            if step == "write" and recorder is not None and recorder.error is not None:
                cause = recorder.error
            if cause is not None:
                raise _fail(step, path, cause) from exc
            if isinstance(exc, Exception) and not isinstance(
                exc, (TypeError, CheckpointWriteError)
            ):
                raise CheckpointWriteError(
                    f"could not {step} {path}: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        return tmp, found

    def move_into_place(self, tmp: Path, path: Path, *, durable: bool) -> None:
        """Rename a written temporary file onto ``path``, then fsync the directory.

        On failure of the rename the temporary file is removed; on failure of
        the directory fsync the file is in place but its name may not
        survive a power loss. Either raises :class:`CheckpointWriteError`.
        """
        self._check(path, "write")
        try:
            self._sys_rename(tmp, path)
        except OSError as exc:
            self.remove_quietly(tmp)
            raise _fail("move into place", path, exc) from exc
        if durable:
            try:
                self._sys_fsync_dir(path.parent)
            except OSError as exc:
                raise _fail("fsync the directory of", path, exc) from exc

    def rename(self, source: Path, dest: Path) -> bool:
        """Rename ``source`` onto ``dest``; ``False`` when ``source`` is gone."""
        self._check(source, "move")
        self._check(dest, "move a file to")
        try:
            self._sys_rename(source, dest)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and self.entry(source) is None:
                return False
            raise _fail("move", f"{source} to {dest}", exc) from exc
        return True

    def write_atomic(
        self, path: Path, data: bytes, *, durable: bool, sync_dir: bool = True
    ) -> None:
        """Replace ``path`` with ``data`` atomically (and durably)."""
        tmp = self.write_temp(path, lambda handle: handle.write(data), durable=durable)
        self.move_into_place(tmp, path, durable=durable and sync_dir)

    def make_link(
        self, path: Path, target: str, *, durable: bool, sync_dir: bool = True
    ) -> str:
        """Point ``path`` at ``target`` atomically; return how it was done.

        A symlink is made under a temporary name and renamed onto ``path``,
        so at every instant ``path`` is the old link or the new one. Where
        symlinks cannot be made (some shared file systems), a hard link is
        tried, then a copy, each published the same atomic way.

        Returns
        -------
        str
            ``"symlink"``, ``"hardlink"`` or ``"copy"``.
        """
        directory = path.parent
        tmp = directory / temp_name(path.name)
        self._check(path, "update the alias")
        how = "symlink"
        try:
            try:
                self._sys_symlink(target, tmp)
            except OSError as exc:
                if exc.errno not in _NO_SYMLINK_ERRNOS:
                    raise
                how = "hardlink"
                source = self.real(directory / target)
                try:
                    self._sys_link(source, tmp)
                except OSError:
                    how = "copy"
                    with self.open_payload(source) as src:
                        tmp = self.write_temp(
                            path,
                            lambda out: shutil.copyfileobj(src, out),
                            durable=durable,
                        )
            self._sys_rename(tmp, path)
        except (OSError, CheckpointWriteError) as exc:
            self.remove_quietly(tmp)
            if isinstance(exc, CheckpointWriteError):
                raise
            raise _fail("update the alias", path, exc) from exc
        if durable and sync_dir:
            self.sync_dir(directory, holding=[path])
        return how

    def remove(self, path: Path) -> bool:
        """Remove a file (a link itself, never its target); ``False`` if gone."""
        self._check(path, "remove")
        try:
            self._sys_unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _fail("remove", path, exc) from exc
        return True

    def remove_quietly(self, path: Path) -> None:
        """Remove a leftover of a failed step; any error is ignored."""
        with contextlib.suppress(OSError, CheckpointWriteError):
            self.remove(path)

    def sync_dir(self, directory: Path, *, holding: Iterable[Path] = ()) -> None:
        """Make the entries of ``directory`` durable; ``holding`` for messages."""
        try:
            self._sys_fsync_dir(directory)
        except OSError as exc:
            names = ", ".join(str(p) for p in holding) or str(directory)
            raise _fail("fsync the directory holding", names, exc) from exc

    def make_dirs(self, directory: Path, *, durable: bool) -> None:
        """Create ``directory`` and its missing parents, each durable in its parent.

        A new directory's own entry lives in its parent: without an fsync of
        the parent, the directory and everything in it can vanish in a power
        loss even after the files inside were fsynced. A name on the way that
        exists but is not a directory (a file, a dangling link) is an error.
        """
        directory = Path(os.path.abspath(directory))
        missing = []
        for candidate in (directory, *directory.parents):
            found = self.entry(candidate, follow=True)
            if found is None and self.entry(candidate) is not None:
                # A name with nothing behind it, or one another writer has
                # just made: look again before calling it a dangling link.
                found = self.entry(candidate, follow=True) or Entry("", 0, 0, 0, 0)
            if found is not None and found.is_dir:
                break
            if found is not None:
                raise CheckpointWriteError(
                    f"could not create directory {directory}: {candidate} exists "
                    "and is not a directory"
                )
            missing.append(candidate)
        for new in reversed(missing):
            if self.root is not None and not self.root.is_relative_to(new):
                self._check(new, "create the directory")
            if (
                not self._mkdir(new, durable=durable)
                and not (self.entry(new, follow=True) or Entry("", 0, 0, 0, 0)).is_dir
            ):
                raise CheckpointWriteError(
                    f"could not create directory {new}: it exists and is not one"
                )

    def make_dir(self, path: Path, *, durable: bool) -> bool:
        """Create one new directory; ``False`` if the name is taken."""
        self._check(path, "create the directory")
        return self._mkdir(path, durable=durable)

    def _mkdir(self, path: Path, *, durable: bool) -> bool:
        try:
            self._sys_mkdir(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _fail("create the directory", path, exc) from exc
        if durable:
            self.sync_dir(path.parent, holding=[path])
        return True

    def remove_dir(self, path: Path) -> bool:
        """Remove an empty directory; ``False`` if it is gone or not empty.

        The storage's own root is one it may remove (a store that created
        its directory and failed to start leaves nothing).
        """
        if self.root is None or Path(os.path.abspath(path)) != self.root:
            self._check(path, "remove the directory")
        try:
            self._sys_rmdir(path)
        except OSError:
            return False
        return True

    # -- the single-writer lock -------------------------------------------------
    def lock_file(self, path: Path) -> _HeldLock | None:
        """Take the exclusive lock of the lock file ``path``; ``None`` if another holds it.

        The file is created if need be, never through a link and never as
        anything but a regular file (a link or a FIFO planted at its name is
        refused). The lock is the kernel's (``flock``): it dies with its
        holder, even by ``SIGKILL``. A file its releasing holder removed
        between this open and this ``flock`` is not taken for the lock: the
        file now at ``path`` is locked instead (a few times at most, then
        ``None``).

        Raises
        ------
        CheckpointWriteError
            When the lock file cannot be opened, or is not a regular file.
        """
        if fcntl is None:  # pragma: no cover - not POSIX
            from filelock import FileLock, Timeout

            fallback = FileLock(str(path), timeout=0, thread_local=False)
            try:
                fallback.acquire(timeout=0)
            except Timeout:
                return None
            return _HeldLock(path, -1, fallback)
        for _ in range(_LOCK_ATTEMPTS):
            fd = self._open_lock(path)
            try:
                self._sys_flock(fd, path)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            if self._names(path, fd):
                return _HeldLock(path, fd)
            os.close(fd)  # a releasing holder removed this file meanwhile
        return None

    def unlock_file(self, held: _HeldLock) -> None:
        """Give up a lock :meth:`lock_file` took, removing its file.

        The file is removed while it is still locked, and only if it is
        still the one at its path; closing it then releases the lock.
        """
        if held.fallback is not None:  # pragma: no cover - not POSIX
            held.fallback.release(force=True)
            return
        try:
            if self._names(held.path, held.fd):
                self.remove_quietly(held.path)
        finally:
            os.close(held.fd)

    def _open_lock(self, path: Path) -> int:
        """Open (creating it if need be) the lock file ``path``; return its descriptor."""
        self._check(path, "create the lock file")
        try:
            fd = self._sys_open(
                path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644
            )
        except OSError as exc:
            found = self.entry(path)
            if found is not None and not found.is_file:
                raise CheckpointWriteError(
                    f"could not lock {path.parent}: {path} is {_A_KIND[found.kind]}, "
                    "not the store's lock file; remove it"
                ) from None
            raise _fail("open the lock file", path, exc) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CheckpointWriteError(
                f"could not lock {path.parent}: {path} is not a regular file; remove it"
            )
        return fd

    def _names(self, path: Path, fd: int) -> bool:
        """Whether ``path`` names the file open as ``fd`` (same device and inode)."""
        try:
            now = os.fstat(fd)
            found = os.lstat(path)
        except OSError:
            return False
        return (found.st_dev, found.st_ino) == (now.st_dev, now.st_ino)


class _HeldLock(NamedTuple):
    """A lock :meth:`LocalStorage.lock_file` took: the lock file and its descriptor."""

    path: Path
    fd: int
    fallback: object = None
