"""Stopping on a signal (issue 9, item 4), without deepmd-kit: the handler and the step.

The real signal to a real ``dp`` is in ``test_e2e_native.py``; here the
rules, with real signals sent to this process.
"""

from __future__ import annotations

import os
import signal

import pytest

from dp_ckpt_plugin.deepmd.checkpointing import HostRun
from dp_ckpt_plugin.deepmd.preempt import Stopped, StopSignals


@pytest.fixture
def stop():
    handlers = StopSignals(["SIGUSR1", "SIGUSR2"]).install()
    yield handlers
    handlers.restore()


def test_a_signal_before_the_loop_stops_at_once(stop):
    with pytest.raises(Stopped) as info:
        os.kill(os.getpid(), signal.SIGUSR1)
    assert info.value.step is None
    assert info.value.status == 128 + signal.SIGUSR1


def test_a_signal_in_the_loop_waits_for_the_step_boundary(stop):
    stop.in_loop = True
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.received == signal.SIGUSR2
    assert stop.agreed() == signal.SIGUSR2  # one process: no collective


def test_a_second_signal_is_ignored(stop):
    stop.in_loop = True
    os.kill(os.getpid(), signal.SIGUSR2)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.received == signal.SIGUSR2


def test_restore_puts_the_previous_handlers_back():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: seen.append(a[0]))
    try:
        handlers = StopSignals(["SIGUSR1"]).install()
        assert signal.getsignal(signal.SIGUSR1) == handlers._handle
        handlers.restore()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


class FakeStore:
    """What ``check_stop`` asks of a store."""

    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1

    def path_for(self, step):
        return f"models/model.ckpt-{step}.pt"


def stopping(signum=signal.SIGTERM):
    handlers = StopSignals([])
    handlers.received = signum
    return handlers


def test_check_stop_saves_the_steps_done_and_stops():
    store = FakeStore()
    run = HostRun(store, stop=stopping())
    saved = []
    with pytest.raises(Stopped) as info:
        run.check_stop(7, start_step=0, save=saved.append)
    assert saved == [7]
    assert store.waited == 1, "a background save is waited for"
    assert (info.value.step, info.value.path) == (7, "models/model.ckpt-7.pt")
    assert info.value.status == 143


def test_check_stop_does_not_save_a_step_twice():
    run = HostRun(FakeStore(), stop=stopping())
    run.last_saved = 10  # the periodic save of this step happened just before
    saved = []
    with pytest.raises(Stopped):
        run.check_stop(10, start_step=0, save=saved.append)
    assert saved == []


def test_check_stop_before_any_step_saves_nothing():
    saved = []
    with pytest.raises(Stopped) as info:
        HostRun(FakeStore(), stop=stopping()).check_stop(
            20, start_step=20, save=saved.append
        )
    assert saved == []
    assert info.value.step is None


def test_check_stop_goes_on_without_a_signal():
    run = HostRun(FakeStore(), stop=StopSignals([]))
    run.check_stop(3, start_step=0, save=lambda step: pytest.fail("saved"))
    HostRun(FakeStore()).check_stop(3, start_step=0, save=lambda s: pytest.fail("x"))


def test_non_chief_ranks_do_not_claim_the_commit():
    with pytest.raises(Stopped) as info:
        HostRun(FakeStore(), stop=stopping()).check_stop(
            4, start_step=0, save=lambda step: None, chief=False
        )
    assert info.value.path is None
