"""A checkpoint writer that tests run as a child process and kill.

Usage::

    python saver_child.py run DIR BACKEND MAX_KEEP  # resume from latest, save on
    python saver_child.py hold DIR                  # save once, wait for stdin to close
    python saver_child.py try DIR                   # try to save once

Each line on stdout is one event, flushed at once:

- ``ready <step>``: ``latest`` was restored and checked (``0``: nothing yet);
- ``committed <step>``: :meth:`CheckpointManager.save` returned for that step;
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

import sys

# run as a script, this file's directory is sys.path[0]: helpers.py is found there
from helpers import (
    FULL_SIZES,
    make_payload,
    open_manager,
    payload_mismatches,
    temporaries,
)

from dp_ckpt_plugin import RestartNotFoundError, StoreLockedError

#: The child stops by itself after this step (it is killed long before).
LAST_STEP = 100_000


def say(line):
    """Write one event line and flush it."""
    print(line, flush=True)


def run(directory, backend, max_keep):
    """Resume from ``latest``, check it, then save 24 MB step after step."""
    manager = open_manager(directory, backend, max_keep=max_keep, verify="sha256")
    try:
        restored = manager.restore("latest")
    except RestartNotFoundError:
        step = 0
    else:
        step = restored.step
        bad = payload_mismatches(restored.state, step, backend, FULL_SIZES)
        if bad:
            say(f"FAIL latest (step {step}, {restored.path}): {'; '.join(bad)}")
            return 3
    make_payload(step, backend)  # import torch before the clock runs
    say(f"ready {step}")
    while step < LAST_STEP:
        step += 1
        manager.save(step, make_payload(step, backend, FULL_SIZES))
        left = temporaries(directory)
        if left:
            say(f"FAIL temporary files after the save of step {step}: {left}")
            return 4
        say(f"committed {step}")
    return 0


def hold(directory):
    """Save once, holding the lock until stdin closes."""
    with open_manager(directory, max_keep=0, verify="sha256") as manager:
        manager.save(1, make_payload(1))
        say("locked")
        sys.stdin.read()
    say("released")
    return 0


def attempt(directory):
    """Try to save once and say whether the lock allowed it."""
    with open_manager(directory, max_keep=0, verify="sha256") as manager:
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
        backend, max_keep = rest
        return run(directory, backend, int(max_keep))
    if mode == "hold":
        return hold(directory)
    if mode == "try":
        return attempt(directory)
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
