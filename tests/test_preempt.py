"""Stopping on a signal (issue 9, item 4), without deepmd-kit: the handler and the step.

The real signal to a real ``dp`` is in ``test_e2e_native.py``; here the
rules, with real signals sent to this process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import pytest

from dp_ckpt_plugin.deepmd.checkpointing import HostRun
from dp_ckpt_plugin.deepmd.preempt import Stopped, StopSignals


@contextlib.contextmanager
def kept(*signums):
    """Put this process's handlers of ``signums`` back afterwards (a stopped
    run leaves them ignored: its process is ending)."""
    saved = {s: signal.getsignal(s) for s in signums}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.fixture
def stop():
    with kept(signal.SIGUSR1, signal.SIGUSR2):
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
        HostRun(FakeStore(), stop=stopping(), chief=False).check_stop(
            4, start_step=0, save=lambda step: None
        )
    assert info.value.path is None


# -- Ctrl-C ---------------------------------------------------------------------


@pytest.fixture
def ctrl_c():
    with kept(signal.SIGINT, signal.SIGTERM):
        handlers = StopSignals(["SIGINT", "SIGTERM"]).install()
        yield handlers
        handlers.restore()


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_once_a_signal_came_every_stop_signal_is_ignored_to_the_end(first):
    """After the stop is committed (``settle``) and after the handlers are
    given up (``restore``), no stop signal, Ctrl-C included, does anything."""
    names = ["SIGTERM", "SIGUSR1", "SIGINT"]
    with kept(*(getattr(signal, n) for n in names)):
        handlers = StopSignals(names).install()
        handlers.in_loop = True
        os.kill(os.getpid(), first)
        handlers.settle()
        for name in names * 3:
            os.kill(os.getpid(), getattr(signal, name))  # nothing happens
        handlers.restore()
        assert all(
            signal.getsignal(getattr(signal, n)) == signal.SIG_IGN for n in names
        )
        for name in names * 3:
            os.kill(os.getpid(), getattr(signal, name))
        assert handlers.received == first


def test_a_second_ctrl_c_aborts_at_once(ctrl_c):
    ctrl_c.in_loop = True
    os.kill(os.getpid(), signal.SIGINT)
    assert ctrl_c.received == signal.SIGINT  # the first only notes it
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize(
    ("first", "second", "aborts"),
    [
        (signal.SIGINT, signal.SIGTERM, True),  # torchrun: a second Ctrl-C
        (signal.SIGTERM, signal.SIGINT, True),  # a person after the scheduler
        (signal.SIGTERM, signal.SIGTERM, False),  # the save goes on
    ],
)
def test_what_a_second_signal_does(ctrl_c, first, second, aborts):
    ctrl_c.in_loop = True
    os.kill(os.getpid(), first)
    if aborts:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), second)
    else:
        os.kill(os.getpid(), second)
    assert ctrl_c.received == first


def test_a_ctrl_c_the_parent_ignores_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handlers = StopSignals(["SIGINT", "SIGTERM"]).install()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == handlers._handle
        handlers.restore()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigint_is_a_stop_signal_by_default():
    from dp_ckpt_plugin.deepmd.argcheck import plugin_options

    options = plugin_options({"training": {}})
    assert options.stop_signals == ("SIGTERM", "SIGUSR1", "SIGINT")


def test_workers_leave_the_stop_signals_to_the_trainer():
    from dp_ckpt_plugin.deepmd.preempt import ignore_in_worker

    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    seen = []
    try:
        ignore_in_worker((signal.SIGUSR1, signal.SIGUSR2), 3, then=seen.append)
        assert all(
            signal.getsignal(s) == signal.SIG_IGN
            for s in (signal.SIGUSR1, signal.SIGUSR2)
        )
        assert seen == [3]  # deepmd-kit's own worker_init_fn still runs
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# -- how dp ends ------------------------------------------------------------------


@pytest.fixture
def ending(monkeypatch):
    """Run ``cli.main`` with a command that raises; return how it ended."""
    pytest.importorskip("deepmd")
    from dp_ckpt_plugin.deepmd import cli

    died = []

    def die_by(signum):
        died.append(signum)
        raise SystemExit(128 + signum)

    monkeypatch.setattr(cli, "die_by", die_by)
    # cli.main sends the plugin's records where deepmd-kit's go: undo it after
    loggers = [logging.getLogger(name) for name in ("deepmd", "dp_ckpt_plugin")]
    for logger in loggers:
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
        monkeypatch.setattr(logger, "level", logger.level)

    def end(error, command="train"):
        def fail(flags, host):
            raise error

        monkeypatch.setattr(cli, "run_train", fail)
        monkeypatch.setattr(cli, "run_freeze", fail)
        args = (
            ["--pt", "train", "input.json"]
            if command == "train"
            else ["--pt", "freeze"]
        )
        with pytest.raises(SystemExit) as info:
            cli.main(args, host="pt")
        return info.value.code, died

    return end


@pytest.mark.parametrize(
    ("error", "status", "by_signal"),
    [
        (Stopped(signal.SIGINT, 7, "models/model.ckpt-7.pt"), 130, [signal.SIGINT]),
        (Stopped(signal.SIGINT), 130, [signal.SIGINT]),
        (KeyboardInterrupt(), 130, [signal.SIGINT]),
        (Stopped(signal.SIGTERM, 7, "models/model.ckpt-7.pt"), 143, []),
        (Stopped(signal.SIGUSR1), 138, []),
    ],
    ids=["ctrl-c", "ctrl-c-before-loop", "ctrl-c-twice", "sigterm", "sigusr1-early"],
)
def test_ctrl_c_ends_dp_by_sigint_other_signals_by_status(
    ending, error, status, by_signal
):
    assert ending(error) == (status, by_signal)


def test_ctrl_c_during_freeze_says_interrupted(ending, capsys):
    assert ending(KeyboardInterrupt(), "freeze") == (130, [signal.SIGINT])
    captured = capsys.readouterr()
    assert "SIGINT: interrupted (exit status 130)" in captured.out + captured.err
