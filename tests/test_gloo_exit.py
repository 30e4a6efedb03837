"""A rank ends only once torch's gloo threads have let go of their finished work.

A gloo worker drops a collective's tensors just after the caller saw the
collective complete; if it runs only after Python began to finalize, the
thread is ended inside C++ and the rank dies of SIGABRT (a core dump where
the user stopped a run). At exit, the plugin leaves the interpreter's lock
free until no thread named as torch names gloo's workers is running.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest

from dp_ckpt_plugin.deepmd import runtime

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="threads are read from /proc"
)


def _named(name: bytes, body) -> threading.Event:
    """Start a daemon thread named ``name`` (as the OS sees it) running ``body(stop)``."""
    ready, stop = threading.Event(), threading.Event()

    def run() -> None:
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        ready.set()
        body(stop)

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(5)
    return stop


def _spin_for(seconds: float, ended: list[float] | None = None):
    def body(stop: threading.Event) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            pass
        if ended is not None:
            ended.append(time.monotonic())

    return body


def _idle(stop: threading.Event) -> None:
    stop.wait(30)


def _timed(**kwargs) -> float:
    began = time.monotonic()
    runtime.settle_gloo_threads(**kwargs)
    return time.monotonic() - began


def test_a_running_gloo_thread_is_waited_for_until_it_stops():
    ended: list[float] = []
    stop = _named(runtime.GLOO_THREAD, _spin_for(0.4, ended))
    try:
        assert runtime.gloo_threads_running()
        runtime.settle_gloo_threads()
        returned = time.monotonic()
        assert ended, "returned while the thread still ran"
        assert returned - ended[0] < 1.5
        assert not runtime.gloo_threads_running()
    finally:
        stop.set()


@pytest.mark.parametrize(
    ("name", "body"),
    [
        (runtime.GLOO_THREAD, _idle),
        (b"python", _spin_for(5)),
        (b"pt_gloo", _spin_for(5)),
    ],
    ids=["an idle gloo thread", "a running thread of another name", "a name prefix"],
)
def test_nothing_else_holds_the_exit_back(name, body):
    stop = _named(name, body)
    try:
        assert _timed() < 0.2
    finally:
        stop.set()


def test_a_gloo_thread_that_never_stops_holds_the_exit_back_no_longer_than_the_limit():
    stop = _named(runtime.GLOO_THREAD, _spin_for(30))
    try:
        assert 0.3 <= _timed(timeout=0.3) < 1.0
    finally:
        stop.set()


def test_under_torchrun_the_wait_is_registered_once_for_the_exit():
    code = (
        "import atexit, os\n"
        "import torch.distributed as dist\n"
        "from dp_ckpt_plugin.deepmd import runtime\n"
        "os.environ['LOCAL_RANK'] = '0'\n"
        "dist.is_initialized = lambda: True  # deepmd-kit's group is up\n"
        "before = atexit._ncallbacks()\n"
        "runtime.start_process_group(); runtime.start_process_group()\n"
        "print(atexit._ncallbacks() - before)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
