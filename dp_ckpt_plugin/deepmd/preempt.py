"""Stopping training cleanly on a signal (preemption, the end of a job's time).

Clusters end jobs with a signal: Slurm sends ``SIGTERM`` (then ``SIGKILL``
after its ``KillWait``), or ``SIGUSR1`` ahead of the wall time when asked with
``--signal``. :class:`StopSignals` turns the configured signals
(``training._dp_ckpt.stop_signals``) into a stop at a step boundary:

1. the handler only notes the signal (nothing else runs inside it);
2. at the start of each training step the trainer asks :meth:`StopSignals.agreed`;
   under ``torch.distributed`` the ranks agree with one all-reduce (MAX) of
   the signal number, so every rank stops before the same step;
3. the trainer then commits a checkpoint of the steps done, waits for a
   background save, and raises :class:`Stopped`; ``dp`` exits with
   :attr:`Stopped.status`, 128 + the signal number.

A signal that comes before the training loop starts (while data and model
are built) has nothing to save: :class:`Stopped` is raised at once, so the
run ends and its lock is released. A second ``SIGTERM`` or ``SIGUSR1`` while
stopping is ignored: it cannot cut the save short. Once the checkpoint of
the stop is committed (:meth:`StopSignals.settle`), and from the moment the
handlers are given up after a signal came (:meth:`StopSignals.restore`),
every stop signal is ignored until the process ends: the interpreter's
shutdown cannot be cut short either, and the exit status stays 128 + the
first signal's number. Ctrl-C (``SIGINT``, a stop
signal by default) is a person at a terminal: a second one, or any second
signal after it (``torchrun`` turns a second Ctrl-C into ``SIGTERM`` for its
ranks), aborts at once with ``KeyboardInterrupt``; nothing half-written
becomes visible (the store's temporary files are swept at the next start)
and the previous committed checkpoint stays published. A ``SIGINT`` the
parent process set to be ignored (a shell does so for a background job)
stays ignored.

Processes that are not the trainer's, started while training (deepmd-kit's
torch ``DataLoader`` workers), get the same process group, and with it a
terminal's Ctrl-C or a ``kill`` of the group: :func:`ignore_in_worker` makes
them leave the stop signals to the trainer.

The all-reduce of each step is started asynchronously and read at the next
step, so it overlaps a training step instead of adding a round trip to it;
the price is that the ranks stop one step later than a blocking check would
(measured in ``benchmarks/bench_stop_check.py``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger("dp_ckpt_plugin")


class Stopped(BaseException):
    """Training stopped on a signal; unwinds to ``dp``'s exit.

    A ``BaseException`` like ``KeyboardInterrupt``, so that no ``except
    Exception`` on the way swallows it.

    Attributes
    ----------
    signum : int
        The signal.
    step : int or None
        The step of the checkpoint committed on the way out, if any.
    path : Path or None
        That checkpoint.
    """

    def __init__(self, signum: int, step: int | None = None, path=None) -> None:
        super().__init__(signum, step, path)
        self.signum = signum
        self.step = step
        self.path = path

    @property
    def name(self) -> str:
        """The signal's name, such as ``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def status(self) -> int:
        """The exit status: 128 + the signal number, as a shell reports a kill."""
        return 128 + self.signum


class StopSignals:
    """The configured stop signals of one training run.

    Parameters
    ----------
    names : iterable of str
        Canonical signal names (``"SIGTERM"``).
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.signals = [signal.Signals[name] for name in names]
        self.received: int | None = None
        self.in_loop = False
        self._previous: dict[int, object] = {}
        self._pending = None  # (work, buffer) of the all-reduce in flight

    # -- handlers ----------------------------------------------------------------
    def install(self) -> StopSignals:
        """Set the handlers (main thread only; elsewhere nothing is changed)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # a background job's: the shell wants it ignored
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        """Put the previous handlers back; after a signal came, ignore them all.

        A process that received a stop signal is ending (``dp`` exits with
        128 + its number, or dies by ``SIGINT``): the stop signals stay
        ignored until then, so none cuts the shutdown short.

        A reduction still in flight is dropped, not waited for: on a normal
        end it was finished already, and after an error another rank may be
        gone, where waiting would hang until the process group's timeout.
        """
        ending = self.received is not None
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if ending else handler)
        self._previous.clear()
        self._pending = None

    def settle(self) -> None:
        """The stop's checkpoint is committed: ignore every stop signal from now on.

        Nothing is left to abort; the process ends with 128 + the first
        signal's number (main thread only; elsewhere nothing is changed).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            if signal.SIGINT in (signum, self.received):
                # Ctrl-C again (torchrun sends its ranks SIGTERM for it): abort
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            return  # a second SIGTERM or SIGUSR1 while stopping: the save goes on
        self.received = signum
        if not self.in_loop:
            raise Stopped(signum)

    # -- agreeing on a step ----------------------------------------------------------
    def agreed(self) -> int:
        """The signal every rank stops on now (0 to go on).

        Called by every rank at the start of every training step. Without
        ``torch.distributed`` it is this process's signal; with it, the
        MAX over ranks of the value each rank had one step earlier.
        """
        local = self.received or 0
        dist = _distributed()
        if dist is None:
            return local
        import torch

        agreed = 0
        if self._pending is not None:
            work, buffer = self._pending
            work.wait()
            agreed = int(buffer.item())
        buffer = torch.tensor([local], dtype=torch.int64, device="cpu")
        work = dist.all_reduce(buffer, op=dist.ReduceOp.MAX, async_op=True)
        self._pending = (work, buffer)
        return agreed

    def finish(self) -> None:
        """Wait for the all-reduce in flight (every rank started it)."""
        if self._pending is not None:
            work, _ = self._pending
            self._pending = None
            work.wait()

    def announce(self, signum: int, step: int) -> None:
        """Say once that training stops before ``step``."""
        log.warning(
            "%s: stopping before step %d; saving a checkpoint of step %d first",
            signal.Signals(signum).name,
            step + 1,
            step,
        )


def _distributed():
    """``torch.distributed`` if a process group is up, else ``None``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def ignore_in_worker(
    signums: tuple[int, ...], worker_id: int, then: Callable[[int], None] | None = None
) -> None:
    """A ``worker_init_fn``: leave the stop signals to the trainer, then ``then``.

    torch's worker re-raises ``SIGTERM``'s default action, and the trainer
    then dies of "DataLoader worker ... is killed by signal" wherever it is
    (inside a checkpoint's fsync, say) instead of stopping with a checkpoint.
    Runs after torch has set its own handlers in the worker. A worker whose
    trainer is gone exits by itself (torch's parent watchdog).
    """
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    if then is not None:
        then(worker_id)
