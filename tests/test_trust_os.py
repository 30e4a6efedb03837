"""Class 5, the operating system says no (rules 8, 14, 20).

Real refusals, no mocks: a tmpfs remounted read-only, a tmpfs that is full
(of bytes, or of inodes), ``chattr +i`` on a directory or a file (root
ignores permission bits, not the immutable flag), and ``archive`` or
``quarantine`` existing as a plain file. 20 generated cases (a case skips
where ``mount`` or ``chattr`` is not allowed):

- a save of a new run (which archives the earlier run first), with and
  without the lock; a save of a run that resumed from ``latest``, in the
  foreground and in the background (``async_save``): each on a read-only
  file system, in a directory made immutable, and on a full one;
- retention that cannot remove a checkpoint (immutable);
- an archive that cannot be made (``archive`` immutable, or a plain file);
- a quarantine that cannot be made (read-only, ``quarantine`` immutable or
  a plain file): resolution then falls back to the previous checkpoint, or
  refuses with ``CheckpointWriteError``;
- ``dp-ckpt prune`` and ``adopt`` on a read-only store: exit status 1, one
  line on stderr naming the store.

A failing save, archive or prune raises ``CheckpointWriteError`` (never a
bare ``OSError``) whose message names a path in the store and the cause
(the system's own words, such as "Read-only file system"), leaves no
temporary file, and the previous latest checkpoint still restores with its
own payload.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import pytest
from helpers import make_payload, payload_mismatches
from trust_cases import (
    attempt,
    ckpt_name,
    cli,
    cli_problems,
    fill,
    flip_payload_byte,
    manager,
)

from dp_ckpt_plugin.errors import CheckpointWriteError

#: Elements of the arrays of a big payload (about 2.4 MB).
BIG = (150_000, 150_000, 150_000)


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs (``mount(size)``) under ``tmp_path``; unmount it afterwards."""
    mounted = []

    def mount(size="16m", name="mnt"):
        point = tmp_path / name
        point.mkdir()
        done = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point))
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        if _run("umount", str(point)).returncode != 0:
            _run("umount", "-l", str(point))


def remount(point, options):
    done = _run("mount", "-o", f"remount,{options}", str(point))
    assert done.returncode == 0, f"remount,{options} failed: {done.stderr}"


@pytest.fixture
def immutable():
    """``immutable(path)``: ``chattr +i`` it, undone afterwards."""
    made = []

    def make(path):
        done = _run("chattr", "+i", str(path))
        if done.returncode != 0:
            pytest.skip(f"cannot chattr +i here: {done.stderr.strip()}")
        made.append(path)

    yield make
    for path in reversed(made):
        _run("chattr", "-i", str(path))


def first_error(*calls):
    """Call each in turn; return the first exception raised (``None`` if none)."""
    for call in calls:
        try:
            call()
        except Exception as exc:
            return exc
    return None


def temporaries(store):
    return [n for n in os.listdir(store) if ".tmp-" in n]


def refusal_problems(exc, store, cause):
    """How ``exc`` breaks "a CheckpointWriteError naming a path of the store and the cause"."""
    if exc is None:
        return ["nothing was refused"]
    if not isinstance(exc, CheckpointWriteError):
        return [f"raised {type(exc).__name__}: {exc} (not a CheckpointWriteError)"]
    problems = []
    if str(store) not in str(exc):
        problems.append(f"the message names no path in {store}: {exc}")
    if cause.lower() not in str(exc).lower():
        problems.append(f"the message does not say {cause!r}: {exc}")
    return problems


def latest_problems(store, step, sizes=None):
    """The latest checkpoint must still restore, with the payload of ``step``."""
    reader = manager(store, lock=False, verify="digest")
    got = attempt(reader.restore, "latest")
    if got.kind != "ok":
        return [f"the previous latest no longer restores: {got}"]
    if got.value.step != step:
        return [f"latest is now step {got.value.step}, not {step}"]
    kwargs = {"sizes": sizes} if sizes else {}
    wrong = payload_mismatches(got.value.state, step, **kwargs)
    return [f"step {step} reads back wrong: {wrong}"] if wrong else []


def save_steps(store, how, step=4, sizes=None, **kwargs):
    """The calls of one save: ``new`` run, or ``resume`` (sync or ``async``)."""
    payload = make_payload(step, sizes=sizes) if sizes else make_payload(step)
    if how == "new":
        m = manager(store, max_keep=0, **kwargs)
        return m, [lambda: m.save(step, payload), m.close]
    m = manager(store, max_keep=0, async_save=how == "async", **kwargs)
    return m, [
        lambda: m.restore("latest"),
        lambda: m.save(step, payload),
        m.wait,
        m.close,
    ]


def finish(m):
    with contextlib.suppress(Exception):
        m.close()


# -- a read-only file system ------------------------------------------------------

#: (how, lock): a new run with and without the lock (the lock file is the first
#: write; without it, the archive folder is), and a run that resumes from
#: ``latest``, without the lock so that the checkpoint's own write meets the refusal.
READ_ONLY = [("new", True), ("new", False), ("resume", False), ("async", False)]


@pytest.mark.parametrize(
    ("how", "lock"), READ_ONLY, ids=["new", "new-nolock", "resume", "async"]
)
def test_save_on_a_read_only_file_system(tmpfs, how, lock):
    store = fill(tmpfs() / "D")
    remount(store.parent, "ro")
    m, calls = save_steps(store, how, lock=lock)
    exc = first_error(*calls)
    finish(m)
    problems = refusal_problems(exc, store, "Read-only file system")
    problems += latest_problems(store, 3)
    assert not problems, "\n".join(problems)


def test_quarantine_on_a_read_only_file_system(tmpfs):
    store = fill(tmpfs() / "D")
    flip_payload_byte(store / ckpt_name(3), 3)
    remount(store.parent, "ro")
    m = manager(store, verify="digest", max_keep=0)
    got = attempt(m.restore, "latest")
    finish(m)
    assert_fallback_or_refusal(got, store, "Read-only file system")


def assert_fallback_or_refusal(got, store, cause):
    """Resolution fell back to step 2, or refused with a CheckpointWriteError."""
    if got.kind == "ok":
        assert got.value.step == 2, (
            f"restored step {got.value.step}, not the fallback 2"
        )
        assert not payload_mismatches(got.value.state, 2)
        return
    problems = refusal_problems(got.error, store, cause)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", ["prune", "adopt"])
def test_command_on_a_read_only_store(tmpfs, command):
    store = fill(tmpfs() / "D")
    extra = ("--keep-last", "1") if command == "prune" else ()
    remount(store.parent, "ro")
    run = cli(command, store, *extra)
    problems = cli_problems(run)
    if run.rc != 1:
        problems.append(f"exit status {run.rc}, not 1")
    if str(store) not in run.err or "Read-only file system" not in run.err:
        problems.append(f"stderr does not name the store and the cause: {run.err!r}")
    assert not problems, f"{run}: " + "\n".join(problems)


# -- a directory that cannot change ----------------------------------------------


@pytest.mark.parametrize(
    ("how", "lock"), READ_ONLY, ids=["new", "new-nolock", "resume", "async"]
)
def test_save_in_an_immutable_directory(tmp_path, immutable, how, lock):
    store = fill(tmp_path / "D")
    immutable(store)
    m, calls = save_steps(store, how, lock=lock)
    exc = first_error(*calls)
    finish(m)
    problems = refusal_problems(exc, store, "Operation not permitted")
    problems += latest_problems(store, 3)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("what", ["immutable", "a-file"])
def test_archive_cannot_be_made(tmp_path, immutable, what):
    """A new run must archive the earlier run; ``archive`` refuses."""
    store = fill(tmp_path / "D")
    archive = store / "archive"
    if what == "a-file":
        archive.write_text("a user's file called archive\n")
        cause = "exists"
    else:
        archive.mkdir()
        immutable(archive)
        cause = "Operation not permitted"
    m, calls = save_steps(store, "new")
    exc = first_error(*calls)
    finish(m)
    problems = refusal_problems(exc, store, cause)
    if exc is not None and "archive" not in str(exc):
        problems.append(f"the message does not name the archive: {exc}")
    problems += latest_problems(store, 3)
    assert not problems, "\n".join(problems)


def test_retention_cannot_remove(tmp_path, immutable):
    store = fill(tmp_path / "D")
    doomed = store / ckpt_name(1)
    immutable(doomed)
    m = manager(store, max_keep=1)
    exc = first_error(
        lambda: m.restore("latest"), lambda: m.save(4, make_payload(4)), m.close
    )
    finish(m)
    problems = refusal_problems(exc, store, "Operation not permitted")
    if exc is not None and doomed.name not in str(exc):
        problems.append(f"the message does not name {doomed.name}: {exc}")
    problems += latest_problems(store, 4)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("what", ["immutable", "a-file"])
def test_quarantine_cannot_be_made(tmp_path, immutable, what):
    store = fill(tmp_path / "D")
    flip_payload_byte(store / ckpt_name(3), 3)
    folder = store / "quarantine"
    if what == "a-file":
        folder.write_text("a user's file called quarantine\n")
    else:
        folder.mkdir()
        immutable(folder)
    m = manager(store, verify="digest", max_keep=0)
    got = attempt(m.restore, "latest")
    finish(m)
    assert_fallback_or_refusal(got, store, "")


# -- a full file system -------------------------------------------------------------


@pytest.mark.parametrize("how", ["resume", "async"])
def test_save_on_a_full_file_system(tmpfs, how):
    """The disk fills up while the payload is written."""
    store = fill(tmpfs("4m") / "D")
    filler = store.parent / "filler"
    free = shutil.disk_usage(store).free
    filler.write_bytes(b"\0" * max(0, free - 600_000))
    m, calls = save_steps(store, how, sizes=BIG)
    exc = first_error(*calls)
    finish(m)
    problems = refusal_problems(exc, store, "No space left on device")
    if temporaries(store):
        problems.append(f"temporary files left: {temporaries(store)}")
    problems += latest_problems(store, 3)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lock", [True, False], ids=["lock", "nolock"])
def test_new_run_without_inodes(tmpfs, lock):
    """No inode left: a new run cannot make its lock or its archive folder."""
    store = fill(tmpfs() / "D")
    stats = os.statvfs(store)
    remount(store.parent, f"nr_inodes={stats.f_files - stats.f_ffree}")
    m, calls = save_steps(store, "new", lock=lock)
    exc = first_error(*calls)
    finish(m)
    problems = refusal_problems(exc, store, "No space left on device")
    problems += latest_problems(store, 3)
    assert not problems, "\n".join(problems)
