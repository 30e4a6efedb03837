"""The lock leaves no file behind, and removing its file never lets two writers in."""

from __future__ import annotations

import os

import pytest

from dp_ckpt_plugin import StoreLockedError
from dp_ckpt_plugin.checkpoint.layout import HOLDER_NAME, LOCK_NAME
from dp_ckpt_plugin.storage import local
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.store.lock import StoreLock

pytestmark = pytest.mark.skipif(local.fcntl is None, reason="POSIX flock only")


def test_release_removes_the_lock_and_holder_files(tmp_path):
    lock = StoreLock(tmp_path)
    lock.acquire()
    assert sorted(os.listdir(tmp_path)) == sorted([LOCK_NAME, HOLDER_NAME])
    lock.release()
    assert os.listdir(tmp_path) == []
    lock.release()  # idempotent
    with StoreLock(tmp_path):
        pass
    assert os.listdir(tmp_path) == []


def test_a_second_lock_in_the_same_process_is_refused(tmp_path):
    with (
        StoreLock(tmp_path),
        pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"),
    ):
        StoreLock(tmp_path).acquire()


class ReleasingFirst(LocalStorage):
    """A storage whose first ``flock`` comes after another holder released."""

    def __init__(self, root, first: StoreLock) -> None:
        super().__init__(root)
        self.first = first
        self.calls: list[int] = []

    def _sys_flock(self, fd, path):
        if not self.calls:
            self.first.release()  # between B's open and B's flock
        self.calls.append(fd)
        super()._sys_flock(fd, path)


def test_a_file_removed_by_the_releasing_holder_is_not_taken(tmp_path):
    """B opens the lock file, A releases (removing it), then B's flock succeeds.

    B must notice that it locked a removed file, lock the file now at the path
    instead, and be the only holder: C is refused.
    """
    first = StoreLock(tmp_path)
    first.acquire()
    storage = ReleasingFirst(tmp_path, first)
    second = StoreLock(tmp_path, storage=storage)
    second.acquire()
    assert len(storage.calls) == 2, "the stale file was taken for the lock"
    held = second._held  # the file at the path is the one locked
    assert os.path.samestat(os.fstat(held.fd), os.lstat(held.path))
    with pytest.raises(StoreLockedError):
        StoreLock(tmp_path).acquire()
    second.release()
    assert os.listdir(tmp_path) == []


def test_a_lock_file_left_by_a_killed_holder_is_reused(tmp_path):
    (tmp_path / LOCK_NAME).write_text("")
    (tmp_path / HOLDER_NAME).write_text('{"pid": 1}')
    with StoreLock(tmp_path) as lock:
        assert lock.held
        assert f'"pid": {os.getpid()}' in (tmp_path / HOLDER_NAME).read_text()
    assert os.listdir(tmp_path) == []
