"""Every change the plugin makes to process-global state, one check per place.

The places are the rows of the table "Process-global state" in
``docs/architecture.md``; this module reads that table. Each row has a check
here that fails if the change leaks (is not put back, is made from another
thread, reaches the user's process), and the source is scanned for every
call of the kinds that change process-wide state: a call in a file no row
covers for that kind fails, so a new place needs a row and a check.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import HAS_TORCH, assert_same, make_payload

from dp_ckpt_plugin import CheckpointManager

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dp_ckpt_plugin"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: What the *calls* cell holds for a place that makes no such call any more.
NONE = "\N{EN DASH}"

#: The kinds of call that change process-wide state, as the table's *calls* names them.
KINDS = {
    "torch config": r"config\.patch\(|set_crc32_options\(|compute_crc32\s*=",
    "add_safe_globals": r"\badd_safe_globals\(|serialization\.safe_globals\(",
    "_remove_safe_globals": r"\b_remove_safe_globals\b",
    "clear_safe_globals": r"\bclear_safe_globals\(",
    "signal.signal": r"\bsignal\.signal\(",
    "environment": r"os\.environ\[[^\]]+\]\s*=(?!=)|os\.environ\.(setdefault|update|pop|clear)\("
    r"|\bos\.(putenv|unsetenv)\(",
    "working directory": r"\bos\.(chdir|fchdir)\(",
    "umask": r"\bos\.umask\(",
    "logging": r"\.addHandler\(|\.removeHandler\(|\.handlers\s*=(?!=)|\.setLevel\("
    r"|\.propagate\s*=(?!=)|\.addFilter\(|\.filters\s*=(?!=)|logging\.(basicConfig|shutdown"
    r"|disable|captureWarnings)\(|set_log_handles\(",
    "random": r"\brandom\.(seed|setstate)\(|np\.random\.(seed|set_state)\(|torch\.manual_seed\("
    r"|dp_random\.seed\(|_RANDOM_GENERATOR\.set_state\(|set_rng_state(_all)?\(",
    "sys.path": r"\bsys\.path\.(insert|append|extend)\(|\bsys\.path\s*=(?!=)",
    "sys hooks": r"\bsys\.(excepthook|displayhook|settrace|setprofile|setrecursionlimit"
    r"|setswitchinterval)\b|threading\.(excepthook|settrace|setprofile)\b|\batexit\.register\(",
    "faulthandler": r"\bfaulthandler\.\w+\(",
    "torch threads": r"set_num_threads\(|set_num_interop_threads\(",
    "multiprocessing": r"set_start_method\(",
    "warnings": r"warnings\.(filterwarnings|simplefilter|resetwarnings)\(",
    "init_process_group": r"\binit_process_group\(",
    "setattr": r"\bsetattr\(",
    "Backend.register": r"Backend\.register\(",
    "os.dup2": r"\bos\.dup2\(",
    "register_at_fork": r"\bregister_at_fork\(",
}


def table_rows() -> dict[str, dict[str, str]]:
    """The rows of the table, by place: ``where``, ``calls``, ``what``, ``how``."""
    text = ARCHITECTURE.read_text("utf-8")
    section = text.split("## Process-global state", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        place, where, calls, what, how = cells
        rows[place.strip("`")] = {
            "where": re.findall(r"`([\w/]+\.py)`", where),
            "calls": [
                c.strip().strip("`") for c in calls.split(",") if c.strip() != NONE
            ],
            "what": what,
            "how": how,
        }
    return rows


ROWS = table_rows()
CHECKS = {}


def check(place: str):
    """Register the check of one row of the table."""

    def register(fn):
        CHECKS[place] = fn
        return fn

    return register


def source_calls() -> list[tuple[str, str, int]]:
    """Every call of a kind in :data:`KINDS` in the package: (file, kind, line)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for kind, pattern in KINDS.items():
                if re.search(pattern, line):
                    found.append((rel, kind, number))
    return found


def test_the_table_and_the_checks_are_in_step():
    assert len(ROWS) >= 10
    assert sorted(ROWS) == sorted(CHECKS), (
        "a row without a check, or a check without one"
    )
    for place, row in ROWS.items():
        assert row["where"], f"{place}: no file named"
        assert all((PACKAGE / f).is_file() for f in row["where"]), place
        assert all(c in KINDS for c in row["calls"]), f"{place}: {row['calls']}"


def test_every_global_change_in_the_source_has_a_row():
    """A call that changes process-wide state, in a file no row covers for it, fails."""
    covered = {
        (f, c) for row in ROWS.values() for f in row["where"] for c in row["calls"]
    }
    uncovered = [
        f"{file}:{line}: {kind}"
        for file, kind, line in source_calls()
        if (file, kind) not in covered
    ]
    assert uncovered == []
    used = {(file, kind) for file, kind, _ in source_calls()}
    stale = sorted(
        f"{place}: {call}"
        for place, row in ROWS.items()
        for call in row["calls"]
        if not any((f, call) in used for f in row["where"])
    )
    assert stale == [], "a row names a call its files no longer make"


def test_the_scan_finds_what_it_looks_for():
    """The patterns match the calls they are for (a scan that finds nothing passes nothing)."""
    samples = {
        "signal.signal": "    signal.signal(signal.SIGINT, handler)",
        "environment": 'os.environ["X"] = "1"',
        "working directory": "os.chdir(path)",
        "umask": "old = os.umask(0o077)",
        "logging": "logger.handlers = list(source.handlers)",
        "random": "np.random.seed(seed)",
        "torch config": 'config.patch({"save.compute_crc32": False})',
        "faulthandler": "faulthandler.enable()",
        "torch threads": "torch.set_num_threads(1)",
        "multiprocessing": 'multiprocessing.set_start_method("spawn")',
        "sys hooks": "sys.excepthook = hook",
    }
    for kind, line in samples.items():
        assert re.search(KINDS[kind], line), kind
    assert not re.search(KINDS["environment"], 'os.environ.get("X")')


@pytest.mark.parametrize("place", sorted(ROWS))
def test_each_place_is_kept_safe(place, tmp_path, monkeypatch):
    if place not in CHECKS:
        pytest.fail(f"no check for {place}")
    CHECKS[place](tmp_path, monkeypatch)


# -- the checks, one per row ----------------------------------------------------------


def _needs(module: str) -> None:
    pytest.importorskip(module)


def _torch_state(step: int) -> dict:
    import torch

    return {"w": torch.arange(1000.0) * step, "np": np.arange(4.0) * step, "b": b""}


@check("torch-crc32")
def _(tmp_path, monkeypatch):
    """Background saves never turn torch's CRC32 off, in any thread."""
    _needs("torch")
    from torch.utils.serialization import config

    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(config.save.compute_crc32)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with CheckpointManager(tmp_path / "m", format="torch", async_save=True) as m:
            for step in range(1, 5):
                m.save(step, _torch_state(step))
    finally:
        stop.set()
        watcher.join()
    assert seen and all(seen)


@check("torch-allowlist")
def _(tmp_path, monkeypatch):
    """A user's allowlist survives; concurrent loads never lose one; all put back."""
    _needs("torch")
    import torch

    class Mine:
        pass

    torch.serialization.add_safe_globals([Mine, np.ndarray])
    try:
        before = set(torch.serialization.get_safe_globals())
        with CheckpointManager(tmp_path / "m", format="torch", max_keep=0) as m:
            paths = [m.save(step, _torch_state(step)) for step in range(1, 5)]
            errors = []

            def load(path, step):
                try:
                    for _ in range(10):
                        assert_same(m.restore(str(path)).state, _torch_state(step))
                except Exception as exc:  # reported below
                    errors.append(exc)

            threads = [
                threading.Thread(target=load, args=(p, s))
                for s, p in enumerate(paths, 1)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert errors == []
        assert set(torch.serialization.get_safe_globals()) == before
        # a payload without NumPy values: the allowlist is never touched
        plain = tmp_path / "plain"
        with CheckpointManager(plain, format="torch") as m:
            m.save(1, {"w": torch.ones(3)})
            torch.serialization.clear_safe_globals()
            assert m.restore("latest").state["w"].sum() == 3
            assert torch.serialization.get_safe_globals() == []
    finally:
        torch.serialization.clear_safe_globals()


@check("stop-signals")
def _(tmp_path, monkeypatch):
    """Set from the main thread only; the previous handlers come back, or, once a
    signal came (the process is ending), every stop signal is ignored."""
    from dp_ckpt_plugin.deepmd.preempt import StopSignals

    def mine(signum, frame):
        pass

    names = ("SIGTERM", "SIGUSR1", "SIGINT")
    previous = {s: signal.getsignal(getattr(signal, s)) for s in names}
    try:
        for name in names:
            signal.signal(getattr(signal, name), mine)
        elsewhere = []
        worker = threading.Thread(
            target=lambda: elsewhere.append(StopSignals(names).install())
        )
        worker.start()
        worker.join()
        assert all(signal.getsignal(getattr(signal, s)) is mine for s in names)
        quiet = StopSignals(names).install()  # a run that no signal stopped
        assert signal.getsignal(signal.SIGTERM) == quiet._handle
        quiet.restore()
        assert all(signal.getsignal(getattr(signal, s)) is mine for s in names)
        stops = StopSignals(names).install()
        assert signal.getsignal(signal.SIGTERM) == stops._handle
        stops.in_loop = True
        stops._handle(signal.SIGINT, None)  # the first Ctrl-C: stop at the next step
        with pytest.raises(KeyboardInterrupt):
            stops._handle(signal.SIGINT, None)  # the second: abort
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        stops.restore()  # the process is ending: nothing may cut it short
        assert all(
            signal.getsignal(getattr(signal, s)) == signal.SIG_IGN for s in names
        )
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


@check("worker-signals")
def _(tmp_path, monkeypatch):
    """A DataLoader worker ignores the stop signals; the trainer's process does not."""
    _needs("torch")
    code = """
import functools, signal
import torch
from torch.utils.data import DataLoader, Dataset
from dp_ckpt_plugin.deepmd.preempt import ignore_in_worker

class Seen(Dataset):
    def __len__(self):
        return 1
    def __getitem__(self, i):
        return int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)

init = functools.partial(ignore_in_worker, (signal.SIGTERM, signal.SIGINT))
loader = DataLoader(Seen(), num_workers=1, worker_init_fn=init)
print(int(next(iter(loader))), int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["1", "0"], out.stderr


@check("die-by")
def _(tmp_path, monkeypatch):
    """The default action is set only to end the process by the signal."""
    code = (
        "import signal\n"
        "from dp_ckpt_plugin.deepmd.cli import die_by\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"
        "die_by(signal.SIGTERM)\n"
        "print('still here')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM and "still here" not in done.stdout


@check("fork-hooks")
def _(tmp_path, monkeypatch):
    """A child forked while another thread held a lock of the plugin gets it
    anew; a lock of the user's stays as it was."""
    code = """
import os, threading
from dp_ckpt_plugin.objectstore import registry
mine = threading.Lock()
mine.acquire()
held = threading.Event()
def hold():
    registry._lock.acquire()
    held.set()
    threading.Event().wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    ours = registry._lock.acquire(timeout=5)
    users = mine.acquire(timeout=0.2)
    os._exit(0 if ours and not users else 1)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["0"], out.stderr


def _logger_states(names):
    return {
        n: (
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
            list(logging.getLogger(n).filters),
        )
        for n in names
    }


@check("command-logging")
def _(tmp_path, monkeypatch):
    """A ``dp`` command run from Python leaves every logger it set as it was."""
    _needs("deepmd")
    from dp_ckpt_plugin.deepmd import cli
    from dp_ckpt_plugin.deepmd.logs import command_loggers

    monkeypatch.chdir(tmp_path)
    names = command_loggers()
    assert {"deepmd", "dp_ckpt_plugin"} <= set(names)
    mine = logging.StreamHandler(sys.stdout)
    logging.getLogger("dp_ckpt_plugin").addHandler(mine)
    try:
        before = _logger_states(names)
        for host in ("pt_expt", "pt"):
            with pytest.raises(SystemExit) as stop:
                cli.main(["train", "missing.json"], host=host)
            assert stop.value.code == 1
            assert _logger_states(names) == before, host
    finally:
        logging.getLogger("dp_ckpt_plugin").removeHandler(mine)


@check("module-swaps")
def _(tmp_path, monkeypatch):
    """An attribute swapped for a call is put back, also when the call fails."""
    from types import SimpleNamespace

    from dp_ckpt_plugin.deepmd.runtime import swapped

    owner = SimpleNamespace(Trainer="deepmd's")
    with pytest.raises(RuntimeError), swapped(owner, "Trainer", "ours"):
        assert owner.Trainer == "ours"
        raise RuntimeError("the training failed")
    assert owner.Trainer == "deepmd's"


@check("process-group")
def _(tmp_path, monkeypatch):
    """Outside ``torchrun`` no process group is started."""
    _needs("torch")
    import torch.distributed as dist

    from dp_ckpt_plugin.deepmd.runtime import start_process_group

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert start_process_group() is False
    assert not (dist.is_available() and dist.is_initialized())


def _generators():
    import random

    import torch

    return (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state())


@check("gloo-exit")
def _(tmp_path, monkeypatch):
    """Under torchrun, one function at exit, registered once, that changes nothing."""
    import atexit

    from dp_ckpt_plugin.deepmd import runtime

    runtime.settle_gloo_at_exit.cache_clear()
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    runtime.start_process_group()  # outside torchrun: nothing
    assert registered == []
    monkeypatch.setenv("LOCAL_RANK", "0")
    try:
        runtime.settle_gloo_at_exit()
        runtime.settle_gloo_at_exit()
    finally:
        runtime.settle_gloo_at_exit.cache_clear()  # a registration into the list
    assert registered == [runtime.settle_gloo_threads]
    began = time.monotonic()
    runtime.settle_gloo_threads()  # no gloo thread here: returns at once
    assert time.monotonic() - began < 0.5


@check("random-generators")
def _(tmp_path, monkeypatch):
    """The core never touches a generator; the trainer's capture and restore round-trip."""
    _needs("deepmd")
    import torch

    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs

    before = _generators()
    for format, state in (("torch", _torch_state(1)), ("hdf5", make_payload(1))):
        for background in (False, True):
            directory = tmp_path / f"{format}-{background}"
            with CheckpointManager(
                directory, format=format, async_save=background
            ) as m:
                m.save(1, state)
                m.wait()
                m.restore("latest")
    after = _generators()
    assert before[0] == after[0] and before[1] == after[1]
    assert torch.equal(before[2], after[2])
    saved = capture_rngs()
    drawn = (np.random.random(), torch.rand(1))
    restore_rngs(saved)
    assert np.random.random() == drawn[0] and torch.equal(torch.rand(1), drawn[1])


@check("one-line-guard")
def _(tmp_path, monkeypatch):
    """The guard is one filter of the plugin's logger, last, whatever is added after."""
    from dp_ckpt_plugin.text import guard_logger

    logger = logging.getLogger("dp_ckpt_plugin")
    other = logging.getLogger("deepmd")
    before = list(other.filters)
    extra = logging.Filter("x")
    logger.addFilter(extra)
    try:
        guard_logger()
        guard_logger()
        guards = [f for f in logger.filters if type(f).__name__ == "_OneLine"]
        assert len(guards) == 1 and logger.filters[-1] is guards[0]
    finally:
        logger.removeFilter(extra)
    assert list(other.filters) == before


@check("backend-registry")
def _(tmp_path, monkeypatch):
    """``DP_CKPT_DISABLE=1`` leaves deepmd-kit's backend registry as deepmd-kit made it."""
    _needs("deepmd")
    code = (
        "import deepmd.backend\n"
        "from deepmd.backend.backend import Backend\n"
        "print(Backend.get_backends()['pt-expt'].__module__)\n"
    )
    for value, module in (("1", "deepmd.backend.pt_expt"), ("", "dp_ckpt_plugin")):
        env = {**os.environ, "DP_CKPT_DISABLE": value}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env
        )
        assert done.stdout.strip().startswith(module), done.stderr


@check("writer-process")
def _(tmp_path, monkeypatch):
    """The writer process ignores SIGINT in itself; this process keeps its handler and path."""
    if not HAS_TORCH or not hasattr(os, "memfd_create"):
        pytest.skip("the writer process needs torch and Linux")
    handler = signal.getsignal(signal.SIGINT)
    path = list(sys.path)
    with CheckpointManager(
        tmp_path / "m", format="torch", async_save=True, writer="process"
    ) as m:
        m.save(1, _torch_state(1))
        m.wait()
        pid = m.store._background.process._proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", status).group(1), 16)
        assert ignored & (1 << (signal.SIGINT - 1))
    assert signal.getsignal(signal.SIGINT) is handler
    assert sys.path == path


@check("broken-pipe")
def _(tmp_path, monkeypatch):
    """``dp-ckpt ls D | head -1``: standard output is redirected only as the command ends."""
    directory = tmp_path / "models"
    with CheckpointManager(directory, max_keep=0) as m:
        for step in range(1, 40):
            m.save(step, make_payload(step))
    reader, writer = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dp_ckpt_plugin", "ls", str(directory)],
        stdout=writer,
        stderr=subprocess.PIPE,
    )
    os.close(writer)
    os.read(reader, 10)
    os.close(reader)  # the reader is gone
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 1) and b"Traceback" not in err
