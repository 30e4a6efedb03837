"""The lock leaves no file behind, and removing its file never lets two writers in."""

from __future__ import annotations

import os

import pytest

import dp_ckpt_plugin.lock as lock_module
from dp_ckpt_plugin import StoreLockedError
from dp_ckpt_plugin.layout import HOLDER_NAME, LOCK_NAME
from dp_ckpt_plugin.lock import StoreLock

pytestmark = pytest.mark.skipif(lock_module.fcntl is None, reason="POSIX flock only")


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


def test_a_file_removed_by_the_releasing_holder_is_not_taken(tmp_path, monkeypatch):
    """B opens the lock file, A releases (removing it), then B's flock succeeds.

    B must notice that it locked a removed file, lock the file now at the path
    instead, and be the only holder: C is refused.
    """
    first = StoreLock(tmp_path)
    first.acquire()
    real_flock = lock_module.fcntl.flock
    calls = []

    def flock_after_release(fd, operation):
        if not calls:
            first.release()  # between B's open and B's flock
        calls.append(fd)
        return real_flock(fd, operation)

    monkeypatch.setattr(lock_module.fcntl, "flock", flock_after_release)
    second = StoreLock(tmp_path)
    second.acquire()
    monkeypatch.setattr(lock_module.fcntl, "flock", real_flock)
    assert len(calls) == 2, "the stale file was taken for the lock"
    assert second.storage.is_open_file(second.path, second._fd)
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
