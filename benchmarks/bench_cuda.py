"""Background saves of a CUDA state, both ways, against the bare copies.

Per size (64, 512 and 2,048 MiB in 16 float32 tensors on the GPU), round by
round in turn, through :class:`~dp_ckpt_plugin.CheckpointManager`:

- a bare device-to-host copy into pinned buffers allocated once (``copy_``
  with ``non_blocking``, then the stream synchronized);
- ``torch.save`` of the CUDA state to a path, then an fsync;
- a background save with ``DP_CKPT_CUDA_COPY=device`` and with ``pinned``:
  the loop's stall (``save`` returning, then the loop's stream synchronized,
  as its next kernel would wait) and the time to durable (``save`` + ``wait``);

and prints the min and median of each, the ratios of medians against the
targets (stall / bare pinned copy <= 1.1; durable / (``torch.save`` + fsync)
<= 1.0) and the GPU memory each way added at its peak. Without a CUDA device
it says so and measures nothing. Run::

    .venv/bin/python benchmarks/bench_cuda.py                # 64 512 2048 MiB, 7 rounds
    .venv/bin/python benchmarks/bench_cuda.py --sizes 64 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run import TENSORS
from run import torch_save_fsync as saved_and_fsynced

STALL_TARGET = 1.1
DURABLE_TARGET = 1.0


def cuda_state(mib: int):
    import torch

    n = mib * (1 << 20) // 4 // TENSORS
    gen = torch.Generator(device="cuda").manual_seed(mib)
    return {
        "model": {
            f"w{i}": torch.randn(n, generator=gen, device="cuda")
            for i in range(TENSORS)
        },
        "step": 0,
    }


def bare_pinned_copy(state) -> Callable[[], float]:
    import torch

    tensors = list(state["model"].values())
    buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def run() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for buffer, tensor in zip(buffers, tensors, strict=True):
            buffer.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return time.perf_counter() - start

    return run


def torch_save_fsync(work: Path, state) -> Callable[[], float]:
    """run.py's baseline (``torch.save`` to a path + fsync), the GPU idle first."""
    import torch

    timed = saved_and_fsynced(work, state)

    def run() -> float:
        torch.cuda.synchronize()
        return timed()

    return run


def background(manager, state, durable: list[float]) -> Callable[[], float]:
    import torch

    step = [0]

    def run() -> float:
        step[0] += 1
        torch.cuda.synchronize()
        start = time.perf_counter()
        manager.save(step[0], state)
        torch.cuda.current_stream().synchronize()  # the next kernel waits this long
        stall = time.perf_counter() - start
        manager.wait()
        durable.append(time.perf_counter() - start)
        return stall

    return run


def show(label: str, values: list[float]) -> None:
    print(
        f"    {label:48s} min {min(values) * 1e3:9.1f} ms   "
        f"median {statistics.median(values) * 1e3:9.1f} ms"
    )


def measure(work: Path, mib: int, rounds: int) -> None:
    import torch

    from dp_ckpt_plugin import CheckpointManager

    state = cuda_state(mib)
    variants: dict[str, Callable[[], float]] = {
        "bare pinned device-to-host copy": bare_pinned_copy(state),
        "torch.save of the CUDA state + fsync": torch_save_fsync(work, state),
    }
    durable: dict[str, list[float]] = {}
    managers = []
    for way in ("device", "pinned"):
        os.environ["DP_CKPT_CUDA_COPY"] = way
        manager = CheckpointManager(
            work / f"{mib}-{way}", format="torch", max_keep=2, async_save=True
        )
        managers.append(manager)
        durable[way] = []
        variants[f"background save ({way}): stall"] = background(
            manager, state, durable[way]
        )
    times: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            times[name].append(fn())
            peak[name] = max(
                peak.get(name, 0), torch.cuda.max_memory_allocated() - base
            )
    for manager in managers:
        manager.close()
    for way, values in durable.items():
        times[f"background save ({way}): durable"] = values
    print(f"  {mib} MiB on {torch.cuda.get_device_name()}:")
    for label, values in times.items():
        show(label, values)
    med = {k: statistics.median(v) for k, v in times.items()}
    for way in durable:
        stall = (
            med[f"background save ({way}): stall"]
            / med["bare pinned device-to-host copy"]
        )
        done = (
            med[f"background save ({way}): durable"]
            / med["torch.save of the CUDA state + fsync"]
        )
        added = peak[f"background save ({way}): stall"] / (1 << 20)
        print(
            f"    {way}: stall / bare pinned copy {stall:.3f} "
            f"(target <= {STALL_TARGET}: {'met' if stall <= STALL_TARGET else 'MISSED'}); "
            f"durable / (torch.save + fsync) {done:.3f} "
            f"(target <= {DURABLE_TARGET}: {'met' if done <= DURABLE_TARGET else 'MISSED'}); "
            f"GPU memory added at peak {added:.0f} MiB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--rounds", type=int, default=7, help="rounds (at least 7)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: nothing measured")
        return 0
    print(f"[cuda] background saves of a CUDA state, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as work:
        for mib in args.sizes:
            measure(Path(work), mib, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
