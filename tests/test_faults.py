"""Rules 5-8: a fault at any filesystem step of a save loses nothing.

Each test makes one filesystem call of a save fail with ``ENOSPC``, ``EIO`` or
``EACCES``, by wrapping the system calls of the storage layer
(:class:`~dp_ckpt_plugin.storage.local.LocalStorage`'s ``_sys_*`` methods and
the file handle it gives a format) so that only the call for one file fails.
The semantics these tests pin down:

- Before the commit record is in place (creating, writing, fsyncing or moving
  the payload, fsyncing the directory, writing the record): the save raises
  :class:`CheckpointWriteError` naming the path and the cause, and the
  directory holds exactly what it held before: no temporary file, no
  uncommitted payload, no record.
- While publishing (pointer or alias): the new checkpoint stays committed but
  is not published. The pointer and the alias are put back, so ``latest``
  still resolves to the previous checkpoint. A later save publishes normally.
- While pruning, which comes after publication (rule 13): the new checkpoint
  is committed and published, so ``latest`` is the new one. The payload goes
  before its record, so a failure leaves either the old checkpoint whole and
  committed (it is pruned by the next save) or a record naming no file.

A real ``ENOSPC`` on a 2 MiB tmpfs (root only) checks the same invariants and
the free-space check made before a write starts.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest
from helpers import (
    BACKENDS,
    SUFFIX,
    backend_case,
    committed_steps,
    make_payload,
    open_manager,
    payload_mismatches,
    temporaries,
)

from dp_ckpt_plugin import CheckpointWriteError, UnreadableFileError
from dp_ckpt_plugin.checkpoint.layout import record_name
from dp_ckpt_plugin.checkpoint.records import read_record, verify
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.storage.temp import temp_target

CODES = [errno.ENOSPC, errno.EIO, errno.EACCES]
CODE_IDS = [errno.errorcode[c] for c in CODES]

#: Faults before the commit record exists: (call that fails, file it fails for).
BEFORE_COMMIT = {
    "create": ("open", "payload"),
    "write": ("write", "payload"),
    "fsync": ("fsync", "payload"),
    "replace": ("replace", "payload"),
    "record-create": ("open", "record"),
    "record-fsync": ("fsync", "record"),
    "record-replace": ("replace", "record"),
    "record-dir-fsync": ("dirfsync", "record"),
}
#: Faults after the commit, while the pointer and alias move. Publication
#: fsyncs the store directory once, after both moved ("publish-dir-fsync");
#: that fsync also makes the payload's new name durable (there is no fsync
#: between the payload's move and the pointer's).
#: The store's own pointer is not fsynced (an empty one is skipped): no fault
#: point there.
WHILE_PUBLISHING = {
    "pointer-create": ("open", "pointer"),
    "pointer-replace": ("replace", "pointer"),
    "alias-symlink": ("symlink", "alias"),
    "alias-replace": ("replace", "alias"),
    "publish-dir-fsync": ("dirfsync", "alias"),
}
#: The points also run with the torch backend.
TORCH_POINTS = ["write", "fsync", "replace", "record-replace", "alias-symlink"]

CASES = [backend_case("hdf5", p) for p in (*BEFORE_COMMIT, *WHILE_PUBLISHING)] + [
    backend_case("torch", p) for p in TORCH_POINTS
]


# -- helpers of these tests only (shared ones are in helpers.py) --------------


def file_names(backend, step):
    """Return the names of the files a save of ``step`` writes, by role.

    Parameters
    ----------
    backend : str
        The serialization backend (it decides the suffix).
    step : int
        The step saved.

    Returns
    -------
    dict
        ``payload``, ``record``, ``pointer`` and ``alias`` file names.
    """
    payload = f"model.ckpt-{step}{SUFFIX[backend]}"
    return {
        "payload": payload,
        "record": record_name(payload),
        "pointer": "checkpoint",
        "alias": f"model.ckpt{SUFFIX[backend]}",
    }


def snapshot(directory, backend="hdf5"):
    """Return what a failed save must leave untouched.

    Parameters
    ----------
    directory : Path
        The checkpoint directory.
    backend : str
        The serialization backend (it decides the alias name).

    Returns
    -------
    tuple
        The sorted file names, the pointer's text and the alias's target.
    """
    alias = directory / f"model.ckpt{SUFFIX[backend]}"
    return (
        sorted(os.listdir(directory)),
        (directory / "checkpoint").read_text(),
        os.readlink(alias) if alias.is_symlink() else None,
    )


def assert_names_cause(exc, path, code):
    """Assert that a write error names ``path`` and the cause ``code``.

    Parameters
    ----------
    exc : BaseException
        The error raised.
    path : Path
        The file it must name.
    code : int
        The errno it must carry and describe.
    """
    assert isinstance(exc, CheckpointWriteError)
    assert isinstance(exc, OSError)
    message = str(exc)
    assert str(path) in message, message
    assert os.strerror(code) in message, message
    assert exc.errno == code


class TornWriter:
    """A file whose writes fail once ``limit`` bytes went through.

    The bytes up to the limit do reach the file, as with a disk that fills
    up in the middle of a write.

    Parameters
    ----------
    handle : file object
        The real file.
    fail : callable
        Returns the error to raise.
    limit : int
        Bytes accepted before the first failure.
    """

    def __init__(self, handle, fail, limit=256):
        self._handle = handle
        self._fail = fail
        self._room = limit

    def write(self, data):
        """Write ``data``, or the part that fits and raise."""
        view = memoryview(data).cast("B")
        if len(view) > self._room:
            self._handle.write(view[: self._room])
            self._room = 0
            raise self._fail(self._handle.name)
        self._room -= len(view)
        return self._handle.write(view)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


class FaultInjector:
    """Make one kind of filesystem call fail for one file.

    The calls are the ones :mod:`dp_ckpt_plugin.fsio` makes: ``open`` of a
    temporary file, writes into it, ``os.fsync`` of it, ``os.replace`` onto a
    name, ``os.fsync`` of the directory right after a name was replaced,
    ``os.symlink`` of a temporary link and ``os.unlink``. Every other call
    goes through unchanged.

    Parameters
    ----------
    monkeypatch : pytest.MonkeyPatch
        Undoes the wrapping.
    code : int
        The errno of the injected error.
    """

    def __init__(self, monkeypatch, code):
        self.monkeypatch = monkeypatch
        self.code = code
        self.hits = 0

    def error(self, path):
        """Count and return the injected error for ``path``."""
        self.hits += 1
        return OSError(self.code, os.strerror(self.code), str(path))

    def arm(self, call, name):
        """Make ``call`` fail for the file called ``name`` (final name)."""
        getattr(self, f"_arm_{call}")(name)

    def _arm_open(self, name):
        real = LocalStorage._sys_open

        def sys_open(storage, path, flags, mode=0o644):
            if temp_target(os.path.basename(os.fspath(path))) == name:
                raise self.error(path)
            return real(storage, path, flags, mode)

        self.monkeypatch.setattr(LocalStorage, "_sys_open", sys_open)

    def _arm_write(self, name):
        real = LocalStorage._wrap_handle

        def wrap_handle(storage, handle, path):
            if temp_target(os.path.basename(os.fspath(path))) == name:
                return TornWriter(handle, self.error)
            return real(storage, handle, path)

        self.monkeypatch.setattr(LocalStorage, "_wrap_handle", wrap_handle)

    def _arm_fsync(self, name):
        real = LocalStorage._sys_fsync

        def sys_fsync(storage, fd, path):
            # a temporary file, or (the commit record) the file under its name
            base = os.path.basename(os.fspath(path))
            if name in (temp_target(base), base):
                raise self.error(path)
            return real(storage, fd, path)

        self.monkeypatch.setattr(LocalStorage, "_sys_fsync", sys_fsync)

    def _arm_dirfsync(self, name):
        real_rename, real_fsync_dir = (
            LocalStorage._sys_rename,
            LocalStorage._sys_fsync_dir,
        )
        last = [None]

        def sys_rename(storage, src, dst):
            real_rename(storage, src, dst)
            last[0] = os.path.basename(os.fspath(dst))

        def sys_fsync_dir(storage, directory):
            if last[0] == name:
                raise self.error(directory)
            return real_fsync_dir(storage, directory)

        self.monkeypatch.setattr(LocalStorage, "_sys_rename", sys_rename)
        self.monkeypatch.setattr(LocalStorage, "_sys_fsync_dir", sys_fsync_dir)

    def _arm_replace(self, name):
        real = LocalStorage._sys_rename

        def sys_rename(storage, src, dst):
            if os.path.basename(os.fspath(dst)) == name:
                raise self.error(dst)
            return real(storage, src, dst)

        self.monkeypatch.setattr(LocalStorage, "_sys_rename", sys_rename)

    def _arm_symlink(self, name):
        real = LocalStorage._sys_symlink

        def sys_symlink(storage, target, path):
            if temp_target(os.path.basename(os.fspath(path))) == name:
                raise self.error(path)
            return real(storage, target, path)

        self.monkeypatch.setattr(LocalStorage, "_sys_symlink", sys_symlink)

    def _arm_unlink(self, name):
        real = LocalStorage._sys_unlink

        def sys_unlink(storage, path):
            if os.path.basename(os.fspath(path)) == name:
                raise self.error(path)
            return real(storage, path)

        self.monkeypatch.setattr(LocalStorage, "_sys_unlink", sys_unlink)


# -- injected faults ----------------------------------------------------------


@pytest.mark.parametrize("code", CODES, ids=CODE_IDS)
@pytest.mark.parametrize(("backend", "point"), CASES)
def test_fault_during_save(tmp_path, monkeypatch, backend, point, code):
    """Rules 6-8: a failed step raises, names path and cause, loses nothing."""
    directory = tmp_path / "models"
    before_commit = point in BEFORE_COMMIT
    call, role = BEFORE_COMMIT[point] if before_commit else WHILE_PUBLISHING[point]
    names = file_names(backend, 2)
    with open_manager(directory, backend, max_keep=0, verify="digest") as manager:
        manager.save(1, make_payload(1, backend))
        files, pointer, alias = snapshot(directory, backend)

        faults = FaultInjector(monkeypatch, code)
        faults.arm(call, names[role])
        with pytest.raises(CheckpointWriteError) as info:
            manager.save(2, make_payload(2, backend))
        monkeypatch.undo()

        assert faults.hits >= 1
        assert_names_cause(info.value, directory / names[role], code)
        assert temporaries(directory) == []
        if before_commit:
            # nothing of step 2 is left: no payload, no record
            assert snapshot(directory, backend) == (files, pointer, alias)
            assert committed_steps(directory, backend) == [1]
        else:
            # committed, not published: pointer and alias are put back
            new = sorted([*files, names["payload"], names["record"]])
            assert snapshot(directory, backend) == (new, pointer, alias)
            assert committed_steps(directory, backend) == [1, 2]
            payload = directory / names["payload"]
            verify(payload, read_record(payload), digest=True)
        restored = manager.restore("latest")
        assert restored.step == 1
        assert restored.path == directory / file_names(backend, 1)["payload"]
        assert payload_mismatches(restored.state, 1, backend) == []

        # a later save without the fault goes through; a committed step stays
        manager.save(3, make_payload(3, backend))
        assert temporaries(directory) == []
        kept = [1, 3] if before_commit else [1, 2, 3]
        assert committed_steps(directory, backend) == kept
        restored = manager.restore("latest")
        assert restored.step == 3
        assert payload_mismatches(restored.state, 3, backend) == []
        assert (
            os.readlink(directory / names["alias"]) == file_names(backend, 3)["payload"]
        )


@pytest.mark.parametrize("code", CODES, ids=CODE_IDS)
@pytest.mark.parametrize("role", ["record", "payload"])
def test_fault_while_pruning(tmp_path, monkeypatch, role, code):
    """Rule 13: pruning comes after publication, so ``latest`` is the new one."""
    directory = tmp_path / "models"
    old = file_names("hdf5", 1)
    new = file_names("hdf5", 2)
    with open_manager(directory, max_keep=1, verify="digest") as manager:
        manager.save(1, make_payload(1))
        faults = FaultInjector(monkeypatch, code)
        faults.arm("unlink", old[role])
        if role == "record":
            # a prune's record goes once its payload's removal is durable: at
            # the next save, which commits and publishes before it fails
            manager.save(2, make_payload(2))
            new = file_names("hdf5", 3)
            with pytest.raises(CheckpointWriteError) as info:
                manager.save(3, make_payload(3))
        else:
            with pytest.raises(CheckpointWriteError) as info:
                manager.save(2, make_payload(2))
        monkeypatch.undo()

        assert_names_cause(info.value, directory / old[role], code)
        assert temporaries(directory) == []
        assert (directory / "checkpoint").read_text().strip() == new["payload"]
        assert os.readlink(directory / new["alias"]) == new["payload"]
        restored = manager.restore("latest")
        last = int(new["payload"].split("-")[1].split(".")[0])
        assert restored.step == last
        assert payload_mismatches(restored.state, last) == []
        if role == "payload":
            # the payload goes first: step 1 is still whole and committed
            assert committed_steps(directory) == [1, 2]
            verify(
                directory / old["payload"],
                read_record(directory / old["payload"]),
                digest=True,
            )
        else:
            # the payload is gone, its record stays: it names no file, and
            # nothing counts it
            assert not (directory / old["payload"]).exists()
            assert (directory / old["record"]).is_file()
            # the failure came before this save's own prune: step 2 stays
            assert committed_steps(directory) == [2, 3]

        manager.save(4, make_payload(4))
        assert committed_steps(directory) == [4]
        assert temporaries(directory) == []
        assert payload_mismatches(manager.restore("latest").state, 4) == []
    assert not (directory / old["record"]).exists()


@pytest.mark.parametrize(
    "point", ["create", "write", "fsync", "replace", "dir-fsync", "record-replace"]
)
def test_fault_while_saving_a_step_again(tmp_path, monkeypatch, point):
    """A step saved again stays committed after a fault at any point (issue 13).

    The re-save goes through a record accepting either payload: whatever
    fails, the step is the old or the new checkpoint, committed and verified
    by sha256; never a file without a record that a pointer names.
    """
    directory = tmp_path / "models"
    # a re-save fsyncs the directory after the payload's move (the final
    # record follows): a fault point a first save does not have
    call, role = {**BEFORE_COMMIT, "dir-fsync": ("dirfsync", "payload")}[point]
    with open_manager(directory, max_keep=0, verify="digest") as manager:
        manager.save(1, make_payload(1))
        manager.save(2, make_payload(2))
        before = snapshot(directory)
        faults = FaultInjector(monkeypatch, errno.EIO)
        faults.arm(call, file_names("hdf5", 2)[role])
        with pytest.raises(CheckpointWriteError):
            manager.save(2, make_payload(2))
        monkeypatch.undo()

        assert temporaries(directory) == []
        restored = manager.restore("latest")
        assert restored.step == 2
        assert payload_mismatches(restored.state, 2) == []
        assert committed_steps(directory) == [1, 2]
        assert restored.resolved.checked == "digest"
        if point in ("create", "write", "fsync"):
            assert snapshot(directory) == before

        manager.save(2, make_payload(2))
        assert committed_steps(directory) == [1, 2]
        assert manager.restore("latest").resolved.checked == "digest"


def test_free_space_is_checked_before_any_file_is_created(tmp_path, monkeypatch):
    """Rule 8: too little room for the previous size refuses the save up front."""
    directory = tmp_path / "models"
    with open_manager(directory, max_keep=0, verify="digest") as manager:
        manager.save(1, make_payload(1, sizes=(4096,) * 3))
        size = read_record(directory / file_names("hdf5", 1)["payload"]).size
        before = snapshot(directory)
        opened = []
        real_open = LocalStorage._sys_open

        def spy_open(storage, path, flags, mode=0o644):
            if flags & os.O_CREAT:
                opened.append(path)
            return real_open(storage, path, flags, mode)

        monkeypatch.setattr(LocalStorage, "_sys_open", spy_open)
        monkeypatch.setattr(LocalStorage, "free_bytes", lambda storage, d: size // 2)
        with pytest.raises(CheckpointWriteError) as info:
            manager.save(2, make_payload(2, sizes=(16,) * 3))
        message = str(info.value)
        assert "not enough space" in message
        assert str(directory / file_names("hdf5", 2)["payload"]) in message
        assert str(size) in message
        assert opened == []
        assert snapshot(directory) == before

        monkeypatch.undo()
        manager.save(2, make_payload(2, sizes=(16,) * 3))
        assert (
            payload_mismatches(manager.restore("latest").state, 2, sizes=(16,) * 3)
            == []
        )


@pytest.mark.parametrize("how", ["hardlink", "copy"])
def test_alias_without_symlinks(tmp_path, monkeypatch, how):
    """Where symlinks fail with EPERM, the alias is a hard link or a copy."""
    directory = tmp_path / "models"

    def refuse(*args, **kwargs):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(LocalStorage, "_sys_symlink", refuse)
    if how == "copy":
        monkeypatch.setattr(LocalStorage, "_sys_link", refuse)
    with open_manager(directory, max_keep=2, verify="digest") as manager:
        for step in (1, 2, 3):
            manager.save(step, make_payload(step))
    monkeypatch.undo()

    alias = directory / "model.ckpt.h5"
    newest = directory / "model.ckpt-3.h5"
    assert not alias.is_symlink()
    assert os.path.samefile(alias, newest) == (how == "hardlink")
    assert alias.read_bytes() == newest.read_bytes()
    assert committed_steps(directory) == [2, 3]
    assert temporaries(directory) == []
    with open_manager(directory, verify="digest") as manager:
        assert manager.resolve("latest") == newest
        assert manager.resolve(str(directory)) == newest
        # without the pointer, the alias alone still leads to the newest content
        (directory / "checkpoint").unlink()
        restored = manager.restore(str(directory))
        assert payload_mismatches(restored.state, 3) == []


@pytest.mark.parametrize("reader", ["read_small", "open_payload"])
def test_a_failing_fstat_closes_the_file_and_is_unreadable(
    tmp_path, monkeypatch, reader
):
    """The check of the file just opened fails: the descriptor is closed and the
    failure is an :class:`UnreadableFileError` naming the path and the cause."""
    path = tmp_path / "model.ckpt-1.pt"
    path.write_bytes(b"payload")
    opened = []
    real_open, real_fstat = LocalStorage._sys_open, os.fstat

    def spy_open(storage, where, flags, mode=0o644):
        opened.append(real_open(storage, where, flags, mode))
        return opened[-1]

    def fstat(fd):
        if fd in opened:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fstat(fd)

    monkeypatch.setattr(LocalStorage, "_sys_open", spy_open)
    monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(UnreadableFileError) as info:
        getattr(LocalStorage(), reader)(path)
    monkeypatch.undo()
    assert str(path) in str(info.value)
    assert os.strerror(errno.EIO) in str(info.value)
    assert len(opened) == 1
    with pytest.raises(OSError) as closed:
        os.fstat(opened[0])
    assert closed.value.errno == errno.EBADF


# -- a real full filesystem ---------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path):
    """Mount a 2 MiB tmpfs for the test and unmount it afterwards.

    Skips where mounting is not allowed (not root, no ``mount``, a container
    without the capability).
    """
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and the mount command")
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory, leave):
    """Write a filler file until about ``leave`` bytes stay free; return it.

    Parameters
    ----------
    directory : Path
        Where to write it.
    leave : int
        Bytes to leave free.
    """
    filler = directory / "filler.bin"
    with open(filler, "wb") as handle:
        while (free := shutil.disk_usage(directory).free) > leave:
            handle.write(b"\0" * min(free - leave, 64 * 1024))
            handle.flush()
            os.fsync(handle.fileno())
    return filler


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_full_filesystem(tiny_fs, monkeypatch, backend):
    """Rules 5-8 on a real ENOSPC, and the free-space check before a write."""
    directory = tiny_fs / "models"
    # 64 KiB, 512 KiB, then 4 MiB, more than the whole filesystem: the check
    # before the write passes (it asks for the previous size), the disk fills.
    sizes = [4096, 32768, 262144]
    with open_manager(directory, backend, max_keep=0, verify="digest") as manager:
        saved = 0
        error = None
        for step, size in enumerate(sizes, start=1):
            snap = snapshot(directory, backend) if saved else None
            free = shutil.disk_usage(tiny_fs).free
            try:
                manager.save(step, make_payload(step, backend, (size,) * 3))
            except CheckpointWriteError as exc:
                error = exc
                break
            saved = step
        assert error is not None, "the filesystem never filled up"
        assert saved == len(sizes) - 1
        assert_names_cause(
            error, directory / file_names(backend, step)["payload"], errno.ENOSPC
        )
        assert temporaries(directory) == []
        assert snapshot(directory, backend) == snap
        assert shutil.disk_usage(tiny_fs).free == free  # the torn temporary is gone
        restored = manager.restore("latest")
        assert restored.step == saved
        assert (
            payload_mismatches(restored.state, saved, backend, (sizes[saved - 1],) * 3)
            == []
        )

        # less room than the previous checkpoint took: refused before writing
        filler = fill(tiny_fs, leave=read_record(restored.path).size // 2)
        snap = snapshot(directory, backend)
        opened = []
        real_open = LocalStorage._sys_open

        def spy_open(storage, path, flags, mode=0o644):
            if flags & os.O_CREAT:
                opened.append(path)
            return real_open(storage, path, flags, mode)

        monkeypatch.setattr(LocalStorage, "_sys_open", spy_open)
        with pytest.raises(CheckpointWriteError) as info:
            manager.save(saved + 1, make_payload(saved + 1, backend, (16,) * 3))
        monkeypatch.undo()
        assert opened == []
        assert "not enough space" in str(info.value)
        assert str(directory / file_names(backend, saved + 1)["payload"]) in str(
            info.value
        )
        assert snapshot(directory, backend) == snap

        filler.unlink()
        manager.save(saved + 1, make_payload(saved + 1, backend, (16,) * 3))
        assert temporaries(directory) == []
        restored = manager.restore("latest")
        assert restored.step == saved + 1
        assert payload_mismatches(restored.state, saved + 1, backend, (16,) * 3) == []
