"""Background saves written by a writer process fed from shared memory.

Real files, real torch, a real child process: what it writes restores
exactly; its errors surface once as ``CheckpointWriteError``; its death is
detected and the next save starts a new one; ``close`` and the end of the
run leave no process behind; a Ctrl-C does not stop it mid-write.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import HAS_TORCH, open_fd_targets

from dp_ckpt_plugin import CheckpointManager, CheckpointWriteError
from dp_ckpt_plugin.errors import ConfigError

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def state_of(step: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(step)
    return {
        "model": {
            "w": torch.nn.Parameter(torch.randn(64, 32, generator=gen)),
            "frozen": torch.nn.Parameter(torch.ones(3), requires_grad=False),
            "half": torch.randn(10, generator=gen).to(torch.bfloat16),
            "ids": torch.arange(7, dtype=torch.int64) * step,
            "mask": torch.tensor([True, False, True]),
            "empty": torch.zeros(0, 4),
            "strided": torch.randn(8, 8, generator=gen).t(),
            "scalar": torch.tensor(float(step)),
        },
        "optimizer": {"param_groups": [{"lr": 0.1 / step, "params": [0, 1]}]},
        "numpy": np.arange(5.0) * step,
        "step": step,
        "dtype": torch.float64,
    }


def assert_same(a, b, path="") -> None:
    """Equal value for value: types, dtypes, shapes, ``requires_grad``."""
    import torch

    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (
            b.dtype,
            b.shape,
            b.requires_grad,
        ), path
        assert torch.equal(a.detach(), b.detach()), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    else:
        assert a == b, path


def process_of(manager):
    return manager.store._background.process


def test_a_background_save_is_written_by_the_process_and_restores_exactly(tmp_path):
    import torch

    with CheckpointManager(
        tmp_path / "m", format="torch", max_keep=2, async_save=True, writer="process"
    ) as m:
        state = state_of(1)
        m.save(1, state)
        with torch.no_grad():  # the next optimizer step, while the save runs
            state["model"]["w"].mul_(-1)
        m.wait()
        assert process_of(m) is not None and process_of(m).alive
        assert_same(m.restore("latest").state, state_of(1))
        for step in (2, 3):
            m.save(step, state_of(step))
        m.wait()
        restored = m.restore("latest").state
        assert_same(restored, state_of(3))
        assert type(restored["model"]["w"]) is torch.nn.Parameter
        assert restored["model"]["frozen"].requires_grad is False
        assert [c.step for c in m.store.committed()] == [2, 3]
        pid = process_of(m)._proc.pid
    assert not process_of(m).alive
    assert not _running(pid)


def _snapshot_files() -> list[str]:
    """The shared-memory files of snapshot buffers this process holds open."""
    return sorted(t for t in open_fd_targets().elements() if "dp_ckpt-snapshot-" in t)


def test_close_frees_the_shared_buffers_of_every_manager(tmp_path):
    before = _snapshot_files()
    for run in range(3):  # a process that builds manager after manager
        with CheckpointManager(
            tmp_path / f"m{run}", format="torch", async_save=True, writer="process"
        ) as m:
            m.save(1, state_of(1))
            m.wait()
            assert len(_snapshot_files()) > len(before)  # the buffers, held
        assert _snapshot_files() == before, f"run {run}: shared buffers left open"
        assert_same(m.restore("latest").state, state_of(1))


def test_a_snapshot_kept_past_close_stays_readable():
    """A tensor of a snapshot still referenced (a failed save's traceback keeps
    one) holds its buffer's map: it is freed with the last such tensor."""
    import gc

    import torch

    from dp_ckpt_plugin.background.shm import SharedSnapshotter

    before = _snapshot_files()
    snapshots = SharedSnapshotter()
    kept = snapshots.take({"w": torch.arange(1 << 16, dtype=torch.float64)})
    snapshots.close()
    assert float(kept["w"].sum()) == float(sum(range(1 << 16)))
    del kept
    gc.collect()
    assert _snapshot_files() == before


def test_a_write_error_surfaces_once_as_checkpoint_write_error(tmp_path):
    directory = tmp_path / "m"
    m = CheckpointManager(
        directory, format="torch", max_keep=2, async_save=True, writer="process"
    )
    m.save(1, state_of(1))
    m.wait()
    aside = tmp_path / "aside"
    directory.rename(aside)  # the writer cannot create its temporary file
    m.save(2, state_of(2))
    with pytest.raises(CheckpointWriteError, match="No such file or directory") as info:
        m.wait()
    assert "model.ckpt-2.pt" in str(info.value)
    m.wait()  # raised once
    aside.rename(directory)
    m.save(3, state_of(3))
    m.close()
    with CheckpointManager(directory, format="torch") as again:
        assert again.restore("latest").step == 3


def test_a_dead_writer_process_is_detected_and_replaced(tmp_path):
    m = CheckpointManager(
        tmp_path / "m", format="torch", max_keep=2, async_save=True, writer="process"
    )
    m.save(1, state_of(1))
    m.wait()
    proc = process_of(m)._proc
    import torch

    big = {"w": torch.ones(64 << 20 >> 2)}  # long enough to be killed mid-write
    m.save(2, big)
    proc.kill()
    proc.wait()
    with pytest.raises(CheckpointWriteError, match="writer process ended"):
        m.wait()
    assert not [n for n in os.listdir(tmp_path / "m") if ".tmp-" in n]
    m.save(3, state_of(3))  # a new process
    m.wait()
    assert process_of(m)._proc.pid != proc.pid
    assert [c.step for c in m.store.committed()] == [1, 3]
    m.close()


def test_ctrl_c_does_not_stop_the_writer(tmp_path):
    with CheckpointManager(
        tmp_path / "m", format="torch", max_keep=2, async_save=True, writer="process"
    ) as m:
        m.save(1, state_of(1))
        m.wait()
        os.kill(process_of(m)._proc.pid, signal.SIGINT)
        time.sleep(0.2)
        assert process_of(m).alive
        m.save(2, state_of(2))
        m.wait()
        assert m.restore("latest").step == 2


def test_the_writer_ends_with_the_process_that_started_it(tmp_path):
    """A run killed without closing leaves no writer process behind."""
    program = textwrap.dedent(
        f"""
        import sys, torch
        from dp_ckpt_plugin import CheckpointManager
        m = CheckpointManager(
            {str(tmp_path / "m")!r}, format="torch", async_save=True, writer="process"
        )
        m.save(1, {{"w": torch.ones(1000)}})
        m.wait()
        print(m.store._background.process._proc.pid, flush=True)
        sys.stdin.read()
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    writer = int(run.stdout.readline())
    assert _running(writer)
    run.kill()
    run.wait()
    deadline = time.monotonic() + 10
    while _running(writer) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(writer)


def test_the_writer_ends_with_its_process_also_when_that_process_forked(tmp_path):
    """A child forked from the run lets go of the writer process: the run
    killed, the writer ends while the child still lives."""
    program = textwrap.dedent(
        f"""
        import os, sys, time
        import numpy as np
        from dp_ckpt_plugin import CheckpointManager
        m = CheckpointManager({str(tmp_path / "m")!r}, async_save=True, writer="process")
        m.save(1, {{"w": np.ones(1000)}})
        m.wait()
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        print(m.store._background.process._proc.pid, child, flush=True)
        sys.stdin.read()
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    writer, child = map(int, run.stdout.readline().split())
    try:
        assert _running(writer)
        run.kill()
        run.wait()
        deadline = time.monotonic() + 10
        while _running(writer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(writer)
        assert _running(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_the_thread_is_the_default_and_the_process_is_refused_where_it_cannot_write(
    tmp_path, monkeypatch
):
    from dp_ckpt_plugin.storage.local import LocalStorage

    class Recording(LocalStorage):
        pass

    with CheckpointManager(tmp_path / "d", format="torch", async_save=True) as m:
        assert process_of(m) is None
    monkeypatch.setenv("DP_CKPT_WRITER", "process")
    with CheckpointManager(tmp_path / "e", format="torch", async_save=True) as m:
        assert process_of(m) is not None
    with pytest.raises(
        ConfigError, match="DP_CKPT_WRITER=process cannot be used with the storage"
    ):
        CheckpointManager(
            tmp_path / "m", format="torch", storage=Recording(tmp_path / "m")
        )
    with CheckpointManager(tmp_path / "h", format="hdf5", writer="process") as m:
        assert process_of(m) is not None
    monkeypatch.setenv("DP_CKPT_WRITER", "fork")
    with pytest.raises(ConfigError, match="DP_CKPT_WRITER"):
        CheckpointManager(tmp_path / "x", format="torch")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
