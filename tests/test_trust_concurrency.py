"""Class 1, one manager shared by threads, with background saves (rules 24, 33).

The README says a manager may be shared by several threads. Every
combination of 1, 2, 4 or 8 saving threads, ``async_save`` off or on, the
``hdf5`` and ``torch`` formats (torch cases skip without torch), and a third
party that calls nothing, ``wait()`` or ``close()`` from another thread
meanwhile: 4 x 2 x 2 x 3 = 48 generated cases.

Each thread saves two steps of its own through the shared manager and then
overwrites its payload's arrays in place (the next optimizer step). A format
plugin fails the second step of the first thread (an I/O error), and a
wrapper makes every write take a little while (a slow disk), so that saves
overlap. Afterwards every numbered file in the directory is restored by
name and compared with ``make_payload`` of its own step; every save that
returned is committed, the failed one is not; the failure surfaces exactly
once, as a ``CheckpointWriteError`` naming its file, from a ``save``,
``wait`` or ``close`` of any thread; nothing else is raised.
"""

from __future__ import annotations

import errno
import threading
import time

import numpy as np
import pytest
from helpers import (
    BACKENDS,
    make_arrays,
    make_payload,
    payload_mismatches,
    plugin_manager,
)
from trust_cases import attempt, ckpt_name, manager, step_of

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.errors import CheckpointWriteError

THREADS = (1, 2, 4, 8)
#: What another thread does while the savers run.
THIRD_PARTY = ("none", "wait", "close")
#: Saves per thread.
SAVES = 2
#: Seconds every write is held up before it starts.
SLOW_WRITE = 0.003


def steps_of(thread):
    """The steps thread ``thread`` saves: 11, 12 for the first; 21, 22; ..."""
    return [10 * (thread + 1) + k for k in range(1, SAVES + 1)]


#: The step whose write fails.
FAILING = steps_of(0)[1]


class SlowDisk:
    """Every write waits a little before it starts."""

    @hookimpl(hookwrapper=True)
    def on_save_step(self, format, step, state, file):
        time.sleep(SLOW_WRITE)
        yield


class FailingStep:
    """The write of step :data:`FAILING` fails with an I/O error."""

    @hookimpl(tryfirst=True)
    def on_save_step(self, format, step, state, file):
        if step == FAILING:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return None


def arrays_equal(state, step, backend):
    """Whether the arrays of ``state`` are those of the payload of ``step``."""
    for key, want in make_arrays(step).items():
        got = state[key].numpy() if backend == "torch" else np.asarray(state[key])
        if not np.array_equal(got, want):
            return False
    return True


def scribble(payload):
    """What the next optimizer step does to the arrays the payload holds."""
    for value in payload.values():
        if hasattr(value, "zero_"):
            value.zero_()
        elif hasattr(value, "fill"):
            value.fill(0)


@pytest.mark.parametrize("third_party", THIRD_PARTY)
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_manager_commits_each_steps_own_payload(
    tmp_path, backend, threads, async_save, third_party
):
    directory = tmp_path / "m"
    pm = plugin_manager(SlowDisk(), FailingStep())
    m = manager(directory, backend, pm=pm, max_keep=0, async_save=async_save)
    returned, errors, crashes = set(), [], []
    lock = threading.Lock()
    start = threading.Barrier(threads + (third_party != "none"))
    savers_done = threading.Event()

    def note(exc, where):
        with lock:
            if isinstance(exc, CheckpointWriteError):
                errors.append(f"{where}: {exc}")
            else:
                crashes.append(f"{where}: {type(exc).__name__}: {exc}")

    def saver(thread):
        start.wait()
        for step in steps_of(thread):
            payload = make_payload(step, backend)
            try:
                m.save(step, payload)
            except Exception as exc:
                note(exc, f"save({step})")
            else:
                with lock:
                    returned.add(step)
            scribble(payload)

    def other():
        start.wait()
        call = m.wait if third_party == "wait" else m.close
        while not savers_done.is_set():
            try:
                call()
            except Exception as exc:
                note(exc, f"{third_party}() from another thread")
            time.sleep(0.001)

    workers = [threading.Thread(target=saver, args=(t,)) for t in range(threads)]
    if third_party != "none":
        workers.append(threading.Thread(target=other))
    for w in workers:
        w.start()
    for w in workers[:threads]:
        w.join(60)
    savers_done.set()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers), "a thread did not finish in 60 s"
    try:
        m.close()
    except Exception as exc:
        note(exc, "close()")

    problems = list(crashes)
    bad_name = ckpt_name(FAILING, backend)
    reported = [e for e in errors if bad_name in e]
    if len(reported) != 1:
        problems.append(f"the failure of step {FAILING} surfaced {len(reported)} times")
    problems += [f"unexpected error {e}" for e in errors if bad_name not in e]
    on_disk = {
        step_of(p.name, backend): p
        for p in directory.iterdir()
        if step_of(p.name, backend) is not None
    }
    if FAILING in on_disk:
        problems.append(f"step {FAILING} failed, yet {bad_name} exists")
    missing = returned - {FAILING} - set(on_disk)
    if missing:
        problems.append(f"saves of steps {sorted(missing)} returned but are not there")
    reader = manager(directory, backend, pm=pm, lock=False, verify="digest")
    for step, path in sorted(on_disk.items()):
        got = attempt(reader.restore, str(path))
        if got.kind != "ok":
            problems.append(f"restore({path.name}): {got}")
            continue
        if got.value.resolved.checked != "digest":
            problems.append(
                f"{path.name} is not committed ({got.value.resolved.checked})"
            )
        wrong = payload_mismatches(got.value.state, step, backend)
        if wrong:
            whose = [
                other
                for other in sorted(returned | {FAILING} | set(on_disk))
                if arrays_equal(got.value.state, other, backend)
            ]
            problems.append(
                f"{path.name} holds another payload ({', '.join(wrong)}; "
                f"the arrays of step {whose or '(none of the saved ones)'})"
            )
    assert not problems, "\n".join(problems)
