"""How a background save copies a CUDA tensor: on the device, or into pinned host buffers.

Every path but the CUDA calls themselves runs here on the CPU: a test double
(:class:`CpuAsDevice`) stands for the side-stream copies and treats CPU
tensors as device tensors, so buffer reuse, a changed layout, the order of
copy, finish and the writer's wait, and the first save's log line are
checked without a GPU. The last tests run the real CUDA path where a GPU is
present (skipped otherwise).
"""

from __future__ import annotations

import logging

import pytest
from helpers import HAS_TORCH, open_manager

from dp_ckpt_plugin import ConfigError
from dp_ckpt_plugin.background.saves import BackgroundWriter
from dp_ckpt_plugin.background.snapshot import (
    CUDA_COPIES,
    SideStreamCopies,
    Snapshotter,
    cuda_copy_way,
)

torch = pytest.importorskip("torch") if HAS_TORCH else None
pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
HAS_CUDA = HAS_TORCH and torch.cuda.is_available()


class CpuAsDevice(SideStreamCopies):
    """Side-stream copies whose "device" is the CPU; copies land at ``finish``.

    As on a GPU, a queued copy is not done when ``copy`` returns: it is
    done when the snapshot's copies are finished (the loop's stream then
    waits for them), and the writer must ``wait`` before it reads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.queued: list[tuple] = []
        self.made = 0

    def handles(self, source):
        return source.device.type == "cpu"

    def host_buffer(self, source):
        self.made += 1
        return torch.empty(source.shape, dtype=source.dtype)

    def copy(self, buffer, source, *, pinned=True):
        self.calls.append("copy")
        self.queued.append((buffer, source))

    def finish(self):
        self.calls.append("finish")
        for buffer, source in self.queued:
            buffer.copy_(source)
        self.queued = []

    def wait(self):
        self.calls.append("wait")


def state_of(n: int = 4) -> dict:
    return {
        "model": {"w": torch.nn.Parameter(torch.ones(n)), "b": torch.arange(3.0)},
        "step": 7,
    }


@pytest.mark.parametrize("env", ["", "device", "pinned", " pinned "])
def test_the_way_is_asked_or_the_environment_or_device(monkeypatch, env):
    monkeypatch.setenv("DP_CKPT_CUDA_COPY", env)
    assert cuda_copy_way() == (env.strip() or "device")
    for asked in CUDA_COPIES:
        assert cuda_copy_way(asked) == asked


@pytest.mark.parametrize("bad", ["host", "PINNED", "pinned,device", "\x1b[31mred"])
def test_another_way_is_refused_in_one_line_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv("DP_CKPT_CUDA_COPY", bad)
    with pytest.raises(ConfigError) as caught:
        Snapshotter()
    text = str(caught.value)
    assert "DP_CKPT_CUDA_COPY" in text and "device, pinned" in text
    assert "\n" not in text and "\x1b" not in text


def test_pinned_copies_are_reused_per_layout_and_remade_when_it_changes():
    copies = CpuAsDevice()
    snap = Snapshotter("pinned", copies)
    state = state_of()
    first = snap.take(state)
    assert copies.made == 2 and copies.calls == ["copy", "copy", "finish"]
    assert type(first["model"]["w"]) is torch.nn.Parameter
    assert torch.equal(first["model"]["w"], torch.ones(4)) and first["step"] == 7
    buffer = first["model"]["b"]
    with torch.no_grad():
        state["model"]["w"].mul_(3)  # the next optimizer step
    assert torch.equal(first["model"]["w"], torch.ones(4))  # the snapshot's own
    second = snap.take(state)
    assert copies.made == 2 and second["model"]["b"] is buffer
    assert torch.equal(second["model"]["w"], torch.full((4,), 3.0))
    # a new shape, a new dtype: new buffers, never a copy into the old ones
    state["model"]["b"] = torch.arange(5.0)
    state["model"]["w"] = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    third = snap.take(state)
    assert copies.made == 4 and third["model"]["b"] is not buffer
    assert torch.equal(third["model"]["b"], torch.arange(5.0))
    assert third["model"]["w"].dtype == torch.float64
    # a key that went away takes its buffer with it
    del state["model"]["b"]
    snap.take(state)
    assert set(snap._buffers) == {"/'model'/'w'"}


def test_a_tensor_moving_between_ways_gets_a_buffer_of_its_own():
    copies = CpuAsDevice()
    snap = Snapshotter("pinned", copies)
    pinned = snap.take({"x": torch.ones(3)})["x"]
    snap.cuda_copy = "device"
    same_device = snap.take({"x": torch.full((3,), 2.0)})["x"]
    assert same_device is not pinned and torch.equal(same_device, torch.full((3,), 2.0))
    snap.cuda_copy = "pinned"
    again = snap.take({"x": torch.full((3,), 4.0)})["x"]
    assert again is not same_device and torch.equal(again, torch.full((3,), 4.0))


def test_the_writer_waits_for_the_copies_before_it_writes():
    copies = CpuAsDevice()
    writer = BackgroundWriter()
    writer.snapshots = Snapshotter("pinned", copies)
    seen = []
    state = state_of()

    def prepare():
        return (writer.take(1, state),)

    def work(snapshot):
        seen.append((list(copies.calls), snapshot["model"]["b"].clone()))

    writer.submit(prepare, work)
    writer.shutdown()
    calls, written = seen[0]
    assert calls == ["copy", "copy", "finish", "wait"]
    assert torch.equal(written, torch.arange(3.0))


def test_the_first_snapshot_of_device_tensors_says_the_way_and_its_memory(caplog):
    for way, words in [
        ("device", "on the device: 0.0 MiB of GPU memory"),
        ("pinned", "into 0.0 MiB of pinned host memory on a side stream: no GPU"),
    ]:
        caplog.clear()
        snap = Snapshotter(way, CpuAsDevice())
        with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
            snap.take({"w": torch.ones(1024)})
            snap.take({"w": torch.ones(1024)})
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and words in lines[0], lines
        other = "pinned" if way == "device" else "device"
        assert f"DP_CKPT_CUDA_COPY={other}" in lines[0]
    caplog.clear()
    big = Snapshotter("device", CpuAsDevice())
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        big.take({"w": torch.ones(3 << 18)})  # 3 MiB of float32
    assert "3.0 MiB of GPU memory" in caplog.records[0].getMessage()


def test_a_cpu_state_is_unchanged_by_the_way_and_says_nothing(
    tmp_path, monkeypatch, caplog
):
    written = {}
    for way in CUDA_COPIES:
        monkeypatch.setenv("DP_CKPT_CUDA_COPY", way)
        state = state_of(64)
        with (
            caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"),
            open_manager(tmp_path / way, async_save=True, backend="torch") as m,
        ):
            m.save(1, state)
            with torch.no_grad():
                state["model"]["w"].add_(1)
            m.wait()
            restored = m.restore("latest").state
        written[way] = restored
        assert restored["model"]["w"].device.type == "cpu"
        assert torch.equal(restored["model"]["w"], torch.ones(64))
    assert not [r for r in caplog.records if "CUDA" in r.getMessage()]
    assert torch.equal(written["device"]["model"]["b"], written["pinned"]["model"]["b"])


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("way", CUDA_COPIES)
def test_a_cuda_state_saved_in_the_background_is_the_state_at_the_call(
    tmp_path, monkeypatch, way
):
    monkeypatch.setenv("DP_CKPT_CUDA_COPY", way)
    device = torch.device("cuda")
    state = {"w": torch.randn(1 << 20, device=device), "step": 3}
    expected = state["w"].cpu()
    with open_manager(tmp_path / "m", async_save=True, backend="torch") as m:
        before = torch.cuda.memory_allocated(device)
        m.save(1, state)
        during = torch.cuda.memory_allocated(device)
        state["w"].mul_(-1)  # the next step, on the loop's stream
        m.wait()
        restored = m.restore("latest").state
    assert torch.equal(restored["w"].cpu(), expected)
    grew = during - before
    assert (grew >= expected.numel() * 4) if way == "device" else grew == 0


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_side_stream_copies_are_done_when_waited_for():
    copies = SideStreamCopies()
    source = torch.randn(1 << 16, device="cuda")
    buffer = copies.host_buffer(source)
    assert buffer.is_pinned()
    copies.copy(buffer, source)
    copies.finish()
    source.zero_()  # queued on the loop's stream, after the copy
    copies.wait()
    assert not torch.equal(buffer, torch.zeros_like(buffer))
