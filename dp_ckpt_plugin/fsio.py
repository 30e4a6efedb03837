"""Durable, atomic filesystem primitives.

Every write follows one pattern: write to a temporary name in the destination
directory, flush and fsync it, ``os.replace`` it onto the final name, then fsync
the directory. A failure at any step removes the temporary file and raises a
:class:`~dp_ckpt_plugin.errors.CheckpointWriteError` naming the path and the
cause, leaving whatever the final name held before untouched.

The functions call ``os`` and ``shutil`` through their modules so that tests can
inject faults (``ENOSPC``, ``EIO``, ``EACCES``) at each step.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import CheckpointWriteError, describe_os_error
from .layout import temp_name

#: Errors meaning "this filesystem makes no symlinks", not "something broke".
_NO_SYMLINK_ERRNOS = frozenset(
    {errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
)


def fsync_directory(directory: Path, *, holding: list[Path] = ()) -> None:
    """:func:`fsync_dir`, raising :class:`CheckpointWriteError` naming the files.

    ``holding`` are the files whose new names the fsync makes durable.
    """
    try:
        fsync_dir(directory)
    except OSError as exc:
        names = ", ".join(str(p) for p in holding) or str(directory)
        raise _fail("fsync the directory holding", names, exc) from exc


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry change (a create, rename or unlink) to disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fail(what: str, path: Path, exc: BaseException) -> CheckpointWriteError:
    err = CheckpointWriteError(f"could not {what} {path}: {describe_os_error(exc)}")
    if isinstance(exc, OSError):
        err.errno = exc.errno
    return err


class _ErrorRecorder:
    """A file object that remembers the first OS error its methods raised.

    Serialization libraries report a failed write of the file they were given
    in their own words (h5py: ``Unable to create file (truncated file...)``,
    torch: ``RuntimeError: unexpected pos``), sometimes dropping the original
    error; the store still reports the real cause (``No space left on device``).
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.error: OSError | None = None

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


def _os_cause(exc: BaseException) -> OSError | None:
    """Return the OS error behind ``exc``, looking through wrapping errors.

    Serialization libraries wrap the error of a failed write in their own:
    h5py raises ``OSError("File close failed")`` without an errno, torch a
    ``RuntimeError``; the ``ENOSPC`` or ``EIO`` may be further down the chain.
    """
    first = None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            if exc.errno is not None:
                return exc
            first = first or exc
        exc = exc.__cause__ or exc.__context__
    return first


def write_file_atomic(
    path: Path,
    writer: Callable[[BinaryIO], object],
    *,
    durable: bool = True,
    sync_dir: bool = True,
) -> None:
    """Write a file through ``writer`` and move it onto ``path`` atomically.

    Parameters
    ----------
    path : Path
        Final location. Its directory must exist.
    writer : callable
        Called with a binary file object opened for writing (and reading, so
        formats that seek back, such as HDF5, work).
    durable : bool, optional
        Whether to fsync the file and the directory.
    sync_dir : bool, optional
        Whether to fsync the directory here; a caller that moves several
        files into one directory fsyncs it once itself.

    Raises
    ------
    CheckpointWriteError
        Naming ``path`` and the cause; the temporary file is gone and ``path``
        is as it was.
    """
    tmp = write_temp(path, writer, durable=durable)
    move_into_place(tmp, path, durable=durable and sync_dir)


def write_temp(
    path: Path, writer: Callable[[BinaryIO], object], *, durable: bool = True
) -> Path:
    """Write a file through ``writer`` under a temporary name beside ``path``.

    Returns the temporary path, its content flushed (and fsynced if
    ``durable``). Any failure of the writer, a format's own errors included
    (``torch.save`` raises ``RuntimeError`` on a full disk), removes the
    temporary file and raises :class:`CheckpointWriteError` naming ``path``
    and the cause; a :class:`TypeError` (a value the format refuses) is
    passed on as it is.
    """
    tmp = path.parent / temp_name(path.name)
    step = "create"
    recorder = None
    try:
        with open(tmp, "w+b") as handle:
            step = "write"
            recorder = _ErrorRecorder(handle)
            writer(recorder)
            handle.flush()
            if durable:
                step = "fsync"
                os.fsync(handle.fileno())
    except BaseException as exc:
        _remove_quietly(tmp)
        cause = _os_cause(exc)
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
    return tmp


def move_into_place(tmp: Path, path: Path, *, durable: bool = True) -> None:
    """``os.replace`` a written temporary file onto ``path``, then fsync the directory.

    On failure of the move the temporary file is removed; on failure of the
    directory fsync the file is in place but its name may not survive a
    power loss. Either raises :class:`CheckpointWriteError`.
    """
    try:
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise _fail("move into place", path, exc) from exc
    if durable:
        try:
            fsync_dir(path.parent)
        except OSError as exc:
            raise _fail("fsync the directory of", path, exc) from exc


def make_dirs(directory: Path, *, durable: bool = True) -> None:
    """Create ``directory`` and its missing parents, each made durable in its parent.

    A new directory's own entry lives in its parent: without an fsync of the
    parent, the directory and everything saved in it can vanish in a power
    loss even after the files inside were fsynced.
    """
    missing = []
    for candidate in (directory, *directory.parents):
        if os.path.isdir(candidate):
            break
        missing.append(candidate)
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:
            if not new.is_dir():
                raise
            continue
        if durable:
            fsync_dir(new.parent)


def write_text_atomic(
    path: Path, text: str, *, durable: bool = True, sync_dir: bool = True
) -> None:
    """Replace the content of a small text file atomically."""
    data = text.encode("utf-8")
    write_file_atomic(
        path, lambda handle: handle.write(data), durable=durable, sync_dir=sync_dir
    )


def replace_link(
    path: Path, target: str, *, durable: bool = True, sync_dir: bool = True
) -> str:
    """Point ``path`` at ``target`` atomically; return how it was done.

    A symlink is made under a temporary name and moved onto ``path``, so at
    every instant ``path`` is the old link or the new one. Where symlinks
    cannot be made (some shared filesystems), a hard link is tried, then a
    copy, each published the same atomic way.

    Parameters
    ----------
    path : Path
        The alias to create or replace.
    target : str
        Link target, relative to ``path``'s directory.
    durable : bool, optional
        Whether to fsync the directory afterwards.

    Returns
    -------
    str
        ``"symlink"``, ``"hardlink"`` or ``"copy"``.
    """
    directory = path.parent
    tmp = directory / temp_name(path.name)
    how = "symlink"
    try:
        try:
            os.symlink(target, tmp)
        except OSError as exc:
            if exc.errno not in _NO_SYMLINK_ERRNOS:
                raise
            how = "hardlink"
            try:
                os.link(directory / target, tmp)
            except OSError:
                how = "copy"
                shutil.copyfile(directory / target, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise _fail("update the alias", path, exc) from exc
    if durable and sync_dir:
        try:
            fsync_dir(directory)
        except OSError as exc:
            raise _fail("fsync the directory of", path, exc) from exc
    return how


def remove_file(path: Path) -> None:
    """Remove a file; a file already gone is not an error."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _fail("remove", path, exc) from exc


def free_bytes(directory: Path) -> int | None:
    """Return the bytes available to this user under ``directory``, if known."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None
