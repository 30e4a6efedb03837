"""Rule 10: one writer per checkpoint directory.

A second writer, in the same process or another, is refused with a
:class:`StoreLockedError` naming the holder (pid and command); a lock left by
a SIGKILLed process does not block the next writer; closing releases it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import (
    SAVER_CHILD,
    make_payload,
    open_manager,
    payload_mismatches,
    start_saver,
)

from dp_ckpt_plugin import StoreLockedError
from dp_ckpt_plugin.checkpoint.layout import HOLDER_NAME
from dp_ckpt_plugin.storage.temp import temp_name


def this_command():
    """Return this process's command line as a refusal names it (its first 200 characters)."""
    return " ".join(sys.argv)[:200]


def start_child(mode, directory):
    """Start ``saver_child.py <mode> <directory>`` with pipes; return the process.

    Parameters
    ----------
    mode : str
        ``"hold"`` or ``"try"``.
    directory : Path
        The checkpoint directory.
    """
    return start_saver(mode, directory, stdin=subprocess.PIPE, stderr=subprocess.PIPE)


def try_in_child(directory):
    """Let a child process try to save into ``directory``; return its event line."""
    child = start_child("try", directory)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return out.strip()


@pytest.fixture
def holder_child(tmp_path):
    """Start a child holding the lock of ``tmp_path/models``; kill it afterwards."""
    directory = tmp_path / "models"
    child = start_child("hold", directory)
    try:
        line = child.stdout.readline().strip()
        assert line == "locked", (
            f"{line!r}: {child.stderr.read() if line == '' else ''}"
        )
        yield child, directory
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
        for stream in (child.stdin, child.stdout, child.stderr):
            stream.close()


def test_second_writer_in_the_same_process_is_refused(tmp_path):
    directory = tmp_path / "models"
    with (
        open_manager(directory, max_keep=0) as first,
        open_manager(directory, max_keep=0) as second,
    ):
        first.save(1, make_payload(1))
        # a write of the holder under way must survive the refused writer
        in_flight = directory / temp_name("model.ckpt-2.h5")
        in_flight.write_bytes(b"partial")
        files = sorted(os.listdir(directory))

        with pytest.raises(StoreLockedError) as info:
            second.save(2, make_payload(2))
        message = str(info.value)
        assert str(directory) in message
        assert f"pid {os.getpid()}" in message
        assert this_command() in message
        assert sorted(os.listdir(directory)) == files
        assert (directory / "checkpoint").read_text().strip() == "model.ckpt-1.h5"

        in_flight.unlink()
        first.save(2, make_payload(2))  # the holder is not disturbed
        assert first.restore("latest").step == 2


def test_lock_is_released_on_close(tmp_path):
    directory = tmp_path / "models"
    first = open_manager(directory, max_keep=0)
    first.save(1, make_payload(1))
    first.close()
    with open_manager(directory, max_keep=0) as second:
        second.save(2, make_payload(2))
        # and the other way round, through the context manager
        with (
            open_manager(directory, max_keep=0) as third,
            pytest.raises(StoreLockedError),
        ):
            third.save(3, make_payload(3))
    with open_manager(directory, max_keep=0) as fourth:
        fourth.save(3, make_payload(3))
        assert payload_mismatches(fourth.restore("latest").state, 3) == []


def test_writer_in_a_child_is_refused_while_this_process_holds(tmp_path):
    directory = tmp_path / "models"
    with open_manager(directory, max_keep=0) as holder:
        holder.save(1, make_payload(1))
        line = try_in_child(directory)
        assert line.startswith("refused "), line
        assert f"pid {os.getpid()}" in line
        assert " ".join(this_command().split()) in line
    assert try_in_child(directory) == "saved"


def test_holder_in_a_child_is_named(holder_child):
    child, directory = holder_child
    with open_manager(directory, max_keep=0) as manager:
        with pytest.raises(StoreLockedError) as info:
            manager.save(2, make_payload(2))
        message = str(info.value)
        assert f"pid {child.pid}" in message
        assert f"{SAVER_CHILD} hold {directory}" in message
        # reading is not writing: a restore is allowed while another run holds
        assert manager.restore("latest").step == 1

    child.stdin.close()  # the child closes its manager and exits
    assert child.stdout.readline().strip() == "released"
    assert child.wait(timeout=60) == 0
    with open_manager(directory, max_keep=0) as manager:
        manager.save(2, make_payload(2))


def test_lock_of_a_killed_writer_does_not_block(holder_child):
    child, directory = holder_child
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    # the killed writer's note is still there, naming a dead process
    stale = json.loads((directory / HOLDER_NAME).read_text())
    assert stale["pid"] == child.pid

    with open_manager(directory, max_keep=0) as manager:
        manager.save(2, make_payload(2))
        assert manager.restore("latest").step == 2
        holder = json.loads((directory / HOLDER_NAME).read_text())
        assert holder["pid"] == os.getpid()
        assert try_in_child(directory).startswith(
            f"refused checkpoint directory {directory}"
        )
