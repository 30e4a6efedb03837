"""Class 6, readers of a live store: a run keeps saving while ``dp-ckpt`` reads.

``test_reader_of_a_live_store``: a saver thread commits ``SAVES``
checkpoints with a retention window of 2 (files are removed while the
reader looks), in the foreground or in the background (``async_save``),
while the test runs a reader over and over: ``dp-ckpt verify --json`` and
``verify --digest --json`` (each with both savers), ``ls --json`` and
``show --json``: 6 generated cases. Whether a run of the reader meets a
removal is a race: these cases catch it often, not always.

``test_verify_digest_while_retention_removes_what_it_listed``: 1 case that
does not depend on luck. ``verify --digest --json`` hashes the oldest
checkpoint (96 MB); once the reader holds it open, the run commits two
more, and retention removes the file being hashed and the next one
``verify`` listed.

Every run of a reader must exit with status 0 and print strict JSON; a
checkpoint that retention removed cleanly is not a problem: ``verify``
reports ``"ok": true`` and no problems, ``show`` finds the latest. 7 cases.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest
from helpers import make_payload
from trust_cases import ckpt_name, cli, cli_problems, fill, manager

SAVES = 20
#: Elements of the arrays of the payloads (about 240 kB a checkpoint).
SIZES = (10_000, 10_000, 10_000)
#: Elements of the arrays of a checkpoint that takes a while to hash (96 MB).
HUGE = (4_000_000, 8_000_000, 4_000_000)
READERS = {
    "verify": ("verify", "{D}", "--json"),
    "verify-digest": ("verify", "{D}", "--digest", "--json"),
    "ls": ("ls", "{D}", "--json"),
    "show": ("show", "{D}", "--json"),
}


LOOPS = [
    ("verify", False),
    ("verify", True),
    ("verify-digest", False),
    ("verify-digest", True),
    ("ls", True),
    ("show", True),
]


@pytest.mark.parametrize(
    ("reader", "async_save"),
    LOOPS,
    ids=[f"{r}-{'async' if a else 'sync'}" for r, a in LOOPS],
)
def test_reader_of_a_live_store(tmp_path, reader, async_save):
    store = fill(tmp_path / "D", steps=(1,), max_keep=2)
    m = manager(store, max_keep=2, async_save=async_save)
    m.restore("latest")  # the run resumes from step 1 and goes on
    failures = []
    done = threading.Event()

    def saver():
        try:
            for step in range(2, SAVES + 2):
                m.save(step, make_payload(step, sizes=SIZES))
            m.wait()
        except Exception as exc:
            failures.append(f"the saver failed: {type(exc).__name__}: {exc}")
        finally:
            done.set()

    thread = threading.Thread(target=saver)
    thread.start()
    runs = 0
    argv = [str(store) if a == "{D}" else a for a in READERS[reader]]
    try:
        while not done.is_set() or runs == 0:
            run = cli(*argv)
            runs += 1
            problems = cli_problems(run)
            if run.rc != 0:
                problems.append(f"exit status {run.rc}")
            verdict = run.json if run.json and reader.startswith("verify") else {}
            if verdict and (not verdict.get("ok") or verdict.get("problems")):
                problems.append(f"reported {verdict.get('problems')}")
            if problems:
                failures.append(f"run {runs}: {run}: " + "; ".join(problems))
                break  # one is enough; let the saver finish
    finally:
        thread.join(60)
        m.close()
    assert not failures, f"{len(failures)} of {runs} runs went wrong:\n" + "\n".join(
        failures[:5]
    )


def opened_here(path):
    """Whether this process holds ``path`` open (any thread)."""
    target = os.fspath(path)
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return True
    return False


def test_verify_digest_while_retention_removes_what_it_listed(tmp_path, monkeypatch):
    """While ``verify --digest`` hashes the oldest checkpoint, the run commits
    two more: retention removes the one being hashed and the next one
    ``verify`` listed. Neither is a problem.

    ``verify`` is held, by its storage, just after it opened the oldest
    checkpoint, until the saves are done: the overlap is certain.
    """
    from dp_ckpt_plugin.storage.local import LocalStorage

    store = tmp_path / "D"
    big = store / ckpt_name(1)
    opened, saved = threading.Event(), threading.Event()
    real_open = LocalStorage.open_payload

    def open_payload(storage, path):
        handle = real_open(storage, path)
        if Path(path) == big and threading.current_thread().name == "verify":
            opened.set()
            saved.wait(30)
        return handle

    m = manager(store, max_keep=2)
    try:
        m.save(1, make_payload(1, sizes=HUGE))
        m.save(2, make_payload(2))
        got = {}
        argv = ["verify", str(store), "--digest", "--json"]
        reader = threading.Thread(
            target=lambda: got.update(run=cli(*argv)), name="verify"
        )
        monkeypatch.setattr(LocalStorage, "open_payload", open_payload)
        reader.start()
        overlapped = opened.wait(30)
        m.save(3, make_payload(3))  # retention removes step 1 (being hashed)
        m.save(4, make_payload(4))  # and step 2, which verify listed
        saved.set()
        reader.join(60)
    finally:
        saved.set()
        m.close()
    assert overlapped, "verify never opened the oldest checkpoint"
    assert not (store / ckpt_name(2)).exists(), "retention kept step 2"
    run = got["run"]
    problems = cli_problems(run)
    if run.rc != 0:
        problems.append(f"exit status {run.rc}")
    if run.json is not None and (not run.json.get("ok") or run.json.get("problems")):
        problems.append(f"reported {run.json.get('problems')}")
    assert not problems, f"{run}: " + "; ".join(problems)
