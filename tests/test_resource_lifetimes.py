"""Closing a store releases what it acquired (rule 24), walked over every kind of store.

Each variant builds a :class:`CheckpointManager` (a format, synchronous or
background saves, the writer thread or process, a way of copying CUDA
tensors, a local directory or an S3 URL, saves that fail, a second manager
refused the directory another holds), saves a few steps
(retention prunes some), restores, and closes (``with``, ``close()``, or
``close()`` twice), three rounds in one process after a first round that
lets the process's own lazy state (torch's thread pools, a client's runtime)
come into being. Afterwards the process holds no more than before the
rounds: open descriptors, threads, child processes, maps of the store's
memory files or files, the directory's lock; and a closed manager, still
referenced, keeps no copy of the state it saved. The host side of a ``dp``
run (its preflight, saves and close, in this process) is walked the same
way, and also puts the signal handlers and ``torch.load`` back.
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import os
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    HAS_TORCH,
    make_payload,
    needs_torch,
    open_fd_targets,
    open_manager,
    payload_mismatches,
)

from dp_ckpt_plugin import CheckpointWriteError, StoreLockedError
from dp_ckpt_plugin.store.lock import StoreLock

STEPS = (1, 2, 3, 4)
#: Seconds a thread or process that is ending may take to be gone.
SETTLE = 10.0


# -- what the process holds -------------------------------------------------------


def _children() -> frozenset[int]:
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:  # a thread that ended meanwhile
            continue
    return frozenset(pids)


def _maps(root: Path) -> collections.Counter:
    """Mapped files of the store: its memory files (``dp_ckpt``) or under ``root``."""
    found = collections.Counter()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            name = parts[5].strip() if len(parts) > 5 else ""
            if "dp_ckpt" in name or name.startswith(str(root)):
                found[name] += 1
    return found


@dataclass(frozen=True)
class Held:
    """What the process holds at one moment."""

    fds: collections.Counter
    threads: frozenset[str]
    tasks: int
    children: frozenset[int]
    maps: collections.Counter = field(default_factory=collections.Counter)

    @classmethod
    def now(cls, root: Path) -> Held:
        threads = frozenset(f"{t.name}#{t.ident}" for t in threading.enumerate())
        tasks = len(os.listdir("/proc/self/task"))
        return cls(open_fd_targets(), threads, tasks, _children(), _maps(root))

    def more_than(self, before: Held) -> list[str]:
        """What this holds that ``before`` did not, one line each."""
        more = [f"descriptor of {t}" for t in (self.fds - before.fds).elements()]
        more += [f"thread {t}" for t in sorted(self.threads - before.threads)]
        if self.tasks > before.tasks:
            more.append(f"{self.tasks - before.tasks} more native thread(s)")
        more += [f"child process {p}" for p in sorted(self.children - before.children)]
        more += [f"map of {m}" for m in (self.maps - before.maps).elements()]
        return more


def left_over(before: Held, root: Path) -> list[str]:
    """What the process holds beyond ``before``, once ending threads had time to end."""
    deadline = time.monotonic() + SETTLE
    while True:
        gc.collect()
        more = Held.now(root).more_than(before)
        if not more or time.monotonic() > deadline:
            return more
        time.sleep(0.05)


def array_bytes_held(obj: object) -> int:
    """Bytes of the arrays and tensors reachable from ``obj`` (modules, classes
    and functions not followed: what it holds, not what the program does)."""
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
    seen: set[int] = set()
    todo = [obj]
    total = 0
    torch = sys.modules.get("torch")
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, skip):
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            total += item.nbytes
            continue
        if torch is not None and isinstance(item, torch.Tensor):
            total += item.untyped_storage().nbytes()
            continue
        todo.extend(gc.get_referents(item))
    return total


# -- the variants -------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One kind of manager."""

    format: str
    background: bool = False
    writer: str = "thread"
    cuda_copy: str | None = None
    remote: bool = False

    @property
    def id(self) -> str:
        parts = [self.format, self.writer if self.background else "sync"]
        if self.cuda_copy:
            parts.append(f"cuda-{self.cuda_copy}")
        if self.remote:
            parts.append("s3")
        return "-".join(parts)


def _variants() -> list:
    found = [
        Variant(fmt, background, writer)
        for fmt in ("hdf5", "torch")
        for background, writer in (
            (False, "thread"),
            (True, "thread"),
            (True, "process"),
        )
    ]
    # the writer process always copies a CUDA tensor the pinned way
    found += [
        Variant("torch", True, "thread", cuda_copy=w) for w in ("device", "pinned")
    ]
    found += [Variant("hdf5", remote=True), Variant("hdf5", True, remote=True)]
    needs = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
    return [
        pytest.param(v, id=v.id, marks=[needs] if v.format == "torch" else [])
        for v in found
    ]


#: How each round closes its manager, and whether one of its saves fails first.
ROUNDS = (("with", False), ("close", True), ("twice", False))


def _open(variant: Variant, directory, tmp_path: Path):
    return open_manager(
        directory,
        variant.format,
        max_keep=2,
        async_save=variant.background,
        writer=variant.writer,
        **({"staging": tmp_path / "staging"} if variant.remote else {}),
    )


def _one_round(variant: Variant, directory, tmp_path: Path, how: str, fails: bool):
    """Build, save, restore and close one manager; return it, closed."""
    m = _open(variant, directory, tmp_path)
    try:
        for step in STEPS:
            m.save(step, make_payload(step, variant.format))
        m.wait()
        assert m.flush(60)  # a remote store's uploads: restarts read its HEAD
        restored = m.restore("latest")
        assert restored.step == STEPS[-1]
        assert payload_mismatches(restored.state, STEPS[-1], variant.format) == []
        del restored
    except BaseException:
        m.close()
        raise
    if fails:
        _fail_a_save_and_close(m, variant, tmp_path / "aside")
        _refused_and_closed(variant, directory, tmp_path)
    elif how == "with":
        with m:
            pass
    else:
        m.close()
        if how == "twice":
            m.close()
    return m


def _fail_a_save_and_close(m, variant: Variant, aside: Path) -> None:
    """A payload the format refuses, then a save whose directory went away:
    a background save's error is raised by ``close``, which fails too; once the
    directory is back, closing again finishes."""
    step = STEPS[-1] + 1
    with pytest.raises(TypeError):
        m.save(step, {"x": object()})
    directory = m.directory
    directory.rename(aside)  # the next write cannot create its file
    try:
        with pytest.raises(CheckpointWriteError):
            m.save(step, make_payload(step, variant.format))
            m.close()
    finally:
        aside.rename(directory)
    m.close()


def _refused_and_closed(variant: Variant, directory, tmp_path: Path) -> None:
    """A second manager on a directory another holds: refused, then closed."""
    holder = _open(variant, directory, tmp_path)
    try:
        holder.save(1, make_payload(1, variant.format))
        holder.wait()
        second = _open(variant, directory, tmp_path)
        with pytest.raises(StoreLockedError):
            second.save(2, make_payload(2, variant.format))
        second.close()
    finally:
        holder.close()


@pytest.mark.parametrize("variant", _variants())
def test_closing_releases_what_the_store_acquired(
    variant: Variant, tmp_path, monkeypatch, request
):
    if variant.cuda_copy:
        monkeypatch.setenv("DP_CKPT_CUDA_COPY", variant.cuda_copy)
    if variant.remote:
        directory = request.getfixturevalue("s3_bucket").url
    else:
        directory = tmp_path / "models"
    _one_round(variant, directory, tmp_path, "with", False)  # the lazy state
    before = Held.now(tmp_path)
    kept = [_one_round(variant, directory, tmp_path, *r) for r in ROUNDS]
    more = left_over(before, tmp_path)
    assert not more, "held after closing:\n" + "\n".join(more)
    held = [array_bytes_held(m) for m in kept]
    assert held == [0] * len(kept), "bytes of arrays each closed manager holds"
    # the directory's lock is free: a new store takes it
    lock = StoreLock(kept[-1].directory)
    lock.acquire()
    lock.release()


# -- a dp run's host side, in the user's process ----------------------------------


def _process_wide() -> tuple:
    """What a host run changes for the whole process: signal handlers, torch.load."""
    import signal

    import torch

    handlers = tuple(signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM))
    return handlers, torch.load


@needs_torch
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_closing_a_host_run_releases_what_it_acquired(
    writer, tmp_path, monkeypatch, pm
):
    """``dp``'s preflight, run in this process: lock, writer, served restart
    bytes, stop signals, saves, then the run's close."""
    pytest.importorskip("deepmd")
    from dp_ckpt_plugin.deepmd.prepare import prepare_run
    from dp_ckpt_plugin.ranks import SingleProcess

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DP_CKPT_WRITER", writer)
    training = {"save_dir": "models", "numb_steps": 10, "max_ckpt_keep": 2}
    training["_dp_ckpt"] = {"async_save": True}
    (tmp_path / "input.json").write_text(json.dumps({"training": training}))

    steps = itertools.count(1)  # a restart continues the step count

    def one_run(restart: str | None, twice: bool = False):
        run = prepare_run(
            "input.json",
            restart=restart,
            init_model=None,
            pm=pm,
            ranks=SingleProcess(),
            host="pt_expt",
        )
        run.payloads.start()  # deepmd-kit's loads of the restart are served
        for step in [next(steps) for _ in STEPS]:
            run.store.save(step, make_payload(step, "torch"), background=True)
        run.finish()
        run.close()
        if twice:
            run.close()
        return run

    one_run(None)  # the process's lazy state
    before, wide = Held.now(tmp_path), _process_wide()
    kept = [one_run("latest"), one_run("latest"), one_run("latest", twice=True)]
    more = left_over(before, tmp_path)
    assert not more, "held after closing:\n" + "\n".join(more)
    assert _process_wide() == wide
    held = [array_bytes_held(run) for run in kept]
    assert held == [0] * len(kept), "bytes of arrays each closed run holds"
    lock = StoreLock(tmp_path / "models")
    lock.acquire()
    lock.release()
