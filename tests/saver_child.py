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
(:func:`make_payload`), so whoever reads a checkpoint can tell whether its
content is exactly what was saved.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from dp_ckpt_plugin import (
    CheckpointManager,
    RestartNotFoundError,
    StoreLockedError,
    get_plugin_manager,
)
from dp_ckpt_plugin.layout import is_temp

#: Elements of the three arrays (float64, float32, int64): 24 MB in all.
FULL_SIZES = (1_500_000, 1_000_000, 1_000_000)
#: A payload small enough for tests that only need a save to happen.
SMALL_SIZES = (16, 16, 16)
#: The child stops by itself after this step (it is killed long before).
LAST_STEP = 100_000


def make_payload(step, backend="hdf5", sizes=FULL_SIZES):
    """Return the payload of ``step``.

    Parameters
    ----------
    step : int
        Seeds the content.
    backend : str
        ``"torch"`` gives tensors, anything else numpy arrays.
    sizes : tuple of int
        Elements of the three arrays.

    Returns
    -------
    dict
        ``weights`` (float64), ``moments`` (float32), ``indices`` (int64) and
        ``step`` (int).
    """
    rng = np.random.default_rng(step)
    arrays = {
        "weights": rng.random(sizes[0]),
        "moments": rng.random(sizes[1], dtype=np.float32),
        "indices": rng.integers(0, 1 << 40, sizes[2]),
    }
    if backend == "torch":
        import torch

        arrays = {key: torch.from_numpy(value) for key, value in arrays.items()}
    return {**arrays, "step": int(step)}


def payload_mismatches(state, step, backend="hdf5", sizes=FULL_SIZES):
    """Say how ``state`` differs from the payload of ``step``.

    Parameters
    ----------
    state : dict
        A payload read back.
    step, backend, sizes
        As for :func:`make_payload`.

    Returns
    -------
    list of str
        One entry per key that differs; empty when the content is exact.
    """
    expected = make_payload(step, "hdf5", sizes)
    if not isinstance(state, dict) or sorted(state) != sorted(expected):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        return [f"keys {keys} instead of {sorted(expected)}"]
    bad = []
    if int(state["step"]) != step:
        bad.append(f"step {state['step']} instead of {step}")
    for key, want in expected.items():
        if key == "step":
            continue
        got = state[key].numpy() if backend == "torch" else np.asarray(state[key])
        if got.dtype != want.dtype or not np.array_equal(got, want):
            bad.append(f"{key} differs")
    return bad


def open_manager(directory, backend="hdf5", max_keep=0):
    """Return the manager this child writes with (sha256-verified restores)."""
    return CheckpointManager(
        directory,
        format=backend,
        max_keep=max_keep,
        verify="sha256",
        pm=get_plugin_manager(entry_points=False),
    )


def say(line):
    """Write one event line and flush it."""
    print(line, flush=True)


def run(directory, backend, max_keep):
    """Resume from ``latest``, check it, then save step after step."""
    manager = open_manager(directory, backend, max_keep)
    try:
        restored = manager.restore("latest")
    except RestartNotFoundError:
        step = 0
    else:
        step = restored.step
        bad = payload_mismatches(restored.state, step, backend)
        if bad:
            say(f"FAIL latest (step {step}, {restored.path}): {'; '.join(bad)}")
            return 3
    make_payload(step, backend, SMALL_SIZES)  # import torch before the clock runs
    say(f"ready {step}")
    while step < LAST_STEP:
        step += 1
        manager.save(step, make_payload(step, backend))
        left = [name for name in os.listdir(directory) if is_temp(name)]
        if left:
            say(f"FAIL temporary files after the save of step {step}: {left}")
            return 4
        say(f"committed {step}")
    return 0


def hold(directory):
    """Save once, holding the lock until stdin closes."""
    with open_manager(directory) as manager:
        manager.save(1, make_payload(1, sizes=SMALL_SIZES))
        say("locked")
        sys.stdin.read()
    say("released")
    return 0


def attempt(directory):
    """Try to save once and say whether the lock allowed it."""
    with open_manager(directory) as manager:
        try:
            manager.save(1, make_payload(1, sizes=SMALL_SIZES))
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
