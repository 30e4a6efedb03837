"""A checkpoint writer that tests run as a child process and kill.

Usage::

    python saver_child.py run DIR BACKEND MAX_KEEP [async]  # resume from latest, save on
    python saver_child.py stall DIR BACKEND MAX_KEEP  # save once, stall before pruning
    python saver_child.py hold DIR                    # save once, wait for stdin to close
    python saver_child.py try DIR                     # try to save once

Each line on stdout is one event, flushed at once:

- ``ready <step>``: ``latest`` was restored and checked (``0``: nothing yet);
- ``committed <step>``: that step is durably committed, published and
  retention ran after it: :meth:`CheckpointManager.save` returned for it or,
  with ``async`` (``async_save=True``), the save of the *next* step returned
  (a save first waits for the one in flight and raises its error, so the
  previous one is done, while the next one is being written in the
  background);
- ``published <step>``: ``stall`` committed and published that step and
  stops in an ``on_commit`` observer, before retention runs, until killed;
- ``locked``, ``released``: ``hold`` took and gave up the directory lock;
- ``saved`` or ``refused <message>``: what ``try`` met;
- ``FAIL <what>``: a broken invariant; the exit status is then non-zero.

The payload of a step is a deterministic function of the step
(:func:`helpers.make_payload`, 24 MB for ``run``), so whoever reads a
checkpoint can tell whether its content is exactly what was saved.

This file is a program only: tests start it (:func:`helpers.start_saver`) and
import nothing from it; what it shares with them lives in ``helpers.py``.
"""

from __future__ import annotations

import os
import sys
import time

# run as a script, this file's directory is sys.path[0]: helpers.py is found there
from helpers import (
    FULL_SIZES,
    SMALL_SIZES,
    make_payload,
    open_manager,
    payload_mismatches,
    temporaries,
)

from dp_ckpt_plugin import RestartNotFoundError, StoreLockedError, hookimpl

#: The child stops by itself after this step (it is killed long before).
LAST_STEP = 100_000


def say(line):
    """Write one event line and flush it."""
    print(line, flush=True)


def resume(manager, backend, sizes=FULL_SIZES):
    """Restore and check ``latest``; return its step (0: none), or None if wrong."""
    try:
        restored = manager.restore("latest")
    except RestartNotFoundError:
        return 0
    step = restored.step
    bad = payload_mismatches(restored.state, step, backend, sizes)
    if bad:
        say(f"FAIL latest (step {step}, {restored.path}): {'; '.join(bad)}")
        return None
    return step


def run(directory, backend, max_keep, background=False):
    """Resume from ``latest``, check it, then save 24 MB step after step.

    With ``background`` the manager saves asynchronously: a step is reported
    once the save of the next one returned. Temporary files of this process
    may then be there (the next step's); none of another process may once a
    save of this one is done (the first one swept them).
    """
    manager = open_manager(
        directory, backend, max_keep=max_keep, verify="digest", async_save=background
    )
    step = resume(manager, backend)
    if step is None:
        return 3
    make_payload(step, backend)  # import torch before the clock runs
    say(f"ready {step}")
    first = step + 1
    ours = f".tmp-{os.getpid()}-"
    while step < LAST_STEP:
        step += 1
        manager.save(step, make_payload(step, backend, FULL_SIZES))
        # in the background the first save sweeps the leftovers of earlier
        # writers: they may be there until it is done, once the next returned
        names = [] if background and step == first else temporaries(directory)
        left = [name for name in names if not background or ours not in name]
        if left:
            say(f"FAIL temporary files after the save of step {step}: {left}")
            return 4
        if not background:
            say(f"committed {step}")
        elif step > first:
            say(f"committed {step - 1}")
    manager.close()  # waits for the save in flight
    if background:
        say(f"committed {step}")
    return 0


class StallBeforePruning:
    """An ``on_commit`` observer that says ``published <step>`` and never returns."""

    @hookimpl
    def on_commit(self, checkpoint):
        """Report the commit, then wait to be killed (retention never runs)."""
        say(f"published {checkpoint.step}")
        while True:
            time.sleep(60)


def stall(directory, backend, max_keep):
    """Resume from ``latest`` (small payloads), save the next step, stall."""
    manager = open_manager(
        directory,
        backend,
        plugins=[StallBeforePruning()],
        max_keep=max_keep,
        verify="digest",
    )
    step = resume(manager, backend, SMALL_SIZES)
    if step is None:
        return 3
    say(f"ready {step}")
    manager.save(step + 1, make_payload(step + 1, backend))
    say("FAIL the save returned: the observer did not stall it")
    return 5


def hold(directory):
    """Save once, holding the lock until stdin closes."""
    with open_manager(directory, max_keep=0, verify="digest") as manager:
        manager.save(1, make_payload(1))
        say("locked")
        sys.stdin.read()
    say("released")
    return 0


def attempt(directory):
    """Try to save once and say whether the lock allowed it."""
    with open_manager(directory, max_keep=0, verify="digest") as manager:
        try:
            manager.save(1, make_payload(1))
        except StoreLockedError as exc:
            say("refused " + " ".join(str(exc).split()))
        else:
            say("saved")
    return 0


def main(argv):
    """Dispatch on the mode given first."""
    mode, directory, *rest = argv
    if mode == "run":
        backend, max_keep, *how = rest
        if how not in ([], ["async"]):
            raise SystemExit(f"run takes 'async' or nothing after MAX_KEEP, not {how}")
        return run(directory, backend, int(max_keep), background=how == ["async"])
    if mode == "stall":
        backend, max_keep = rest
        return stall(directory, backend, int(max_keep))
    if mode == "hold":
        return hold(directory)
    if mode == "try":
        return attempt(directory)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
