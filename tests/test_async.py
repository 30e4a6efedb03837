"""Background saves: a consistent snapshot, one save in flight, errors never silent."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import HAS_TORCH, assert_same, make_payload, open_manager, plugin_manager

from dp_ckpt_plugin import CheckpointManager, CheckpointWriteError, FormatInfo, hookimpl
from dp_ckpt_plugin.background.snapshot import Snapshotter


def test_the_snapshot_is_taken_before_save_returns(tmp_path):
    state = {"w": np.arange(1000.0), "meta": {"lr": 0.1, "tags": ["a", (1, None)]}}
    expected = {"w": state["w"].copy(), "meta": {"lr": 0.1, "tags": ["a", (1, None)]}}
    with open_manager(tmp_path / "m", async_save=True) as m:
        m.save(1, state)
        state["w"][:] = -1  # the next optimizer step, while the save runs
        state["meta"]["tags"].append("later")
        m.wait()
        assert_same(m.restore("latest").state, expected)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_tensors_are_copied_into_reused_buffers():
    import torch

    snap = Snapshotter()
    weight = torch.nn.Parameter(torch.ones(3))
    state = {"model": {"w": weight, "b": torch.zeros(2)}, "step": 1}
    first = snap.take(state)
    buffer = first["model"]["b"]
    with torch.no_grad():
        weight.mul_(5)
    assert torch.equal(first["model"]["w"], torch.ones(3))
    assert type(first["model"]["w"]) is torch.nn.Parameter
    second = snap.take(state)
    assert second["model"]["b"] is buffer  # no new allocation for an unchanged shape
    assert torch.equal(second["model"]["w"], torch.full((3,), 5.0))


class SlowThenBroken:
    """A format whose second save fails in the background; saves take a while."""

    def __init__(self):
        self.calls = 0
        self.release = threading.Event()

    @hookimpl
    def register_formats(self):
        return [FormatInfo("slow", ".slow")]

    @hookimpl
    def on_save_step(self, format, state, file):
        if format != "slow":
            return None
        self.calls += 1
        self.release.wait(10)
        if state.get("fail"):
            raise OSError(5, "Input/output error")
        file.write(repr(state).encode())
        return True


def test_one_save_in_flight_and_errors_surface(tmp_path):
    fmt = SlowThenBroken()
    m = CheckpointManager(
        tmp_path / "m", format="slow", pm=plugin_manager(fmt), async_save=True
    )
    m.save(1, {"a": 1})
    assert fmt.calls <= 1  # returned before the write finished
    fmt.release.set()
    m.save(2, {"fail": True})  # waits for save 1, then starts save 2
    assert (tmp_path / "m" / "model.ckpt-1.slow").is_file()
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        m.save(3, {"a": 3})  # the failure of save 2 surfaces here; 3 not started
    m.save(4, {"fail": True})
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        m.wait()
    m.save(5, {"fail": True})
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        m.close()  # the end of the run never swallows it either
    assert [c.step for c in m.store.committed()] == [1]


def test_close_waits_for_the_last_save(tmp_path):
    m = open_manager(tmp_path / "m", async_save=True)
    m.save(7, make_payload(7))
    m.close()
    with open_manager(tmp_path / "m") as again:
        assert again.restore("latest").step == 7
