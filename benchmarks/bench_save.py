"""What a durable, committed checkpoint costs next to deepmd-kit's plain torch.save.

For each payload size, the same state dict is saved, alternately, by

- ``plain``: ``torch.save(state, path)`` straight to the final name (what
  deepmd-kit 3.2 does; not atomic, not durable);
- ``store``: :meth:`CheckpointStore.save` (temporary name, fsync, ``os.replace``,
  directory fsync, sha256 commit record, pointer and alias, retention);
- ``store-nofsync``: the same with ``training._dp_ckpt.fsync: false``.

Each is timed ``--repeat`` times in one run, interleaved, and the medians and
their ratios to ``plain`` are printed. Run::

    .venv/bin/python benchmarks/bench_save.py --sizes 8 64 256 --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dp_ckpt_plugin import CheckpointStore, get_plugin_manager


def make_state(megabytes: int) -> dict:
    """A deepmd-like payload of about ``megabytes`` MB of float32 tensors."""
    n = megabytes * (1 << 20) // 4
    gen = torch.Generator().manual_seed(megabytes)
    weights = torch.randn(n, generator=gen)
    half = n // 2
    return {
        "model": {"w1": weights[:half].clone(), "w2": weights[half:].clone()},
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
    }


def bench(sizes: list[int], repeat: int, root: Path) -> list[tuple]:
    """Return rows of (size MB, method, median seconds)."""
    pm = get_plugin_manager()
    rows = []
    for size in sizes:
        state = make_state(size)
        plain_dir = root / f"plain-{size}"
        plain_dir.mkdir()
        stores = {
            "store": CheckpointStore(root / f"store-{size}", format="torch", pm=pm),
            "store-nofsync": CheckpointStore(
                root / f"nofsync-{size}", format="torch", pm=pm, durable=False
            ),
        }
        times: dict[str, list[float]] = {"plain": [], "store": [], "store-nofsync": []}
        for step in range(repeat):
            t0 = time.perf_counter()
            torch.save(state, plain_dir / f"model.ckpt-{step}.pt")
            times["plain"].append(time.perf_counter() - t0)
            for name, store in stores.items():
                t0 = time.perf_counter()
                store.save(step, state)
                times[name].append(time.perf_counter() - t0)
        for store in stores.values():
            store.close()
        for name, values in times.items():
            rows.append((size, name, statistics.median(values)))
    return rows


def main() -> None:
    """Run the benchmark and print a table of medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[8, 64, 256], help="payload sizes in MB"
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = bench(args.sizes, args.repeat, Path(tmp))
    plain = {size: t for size, name, t in rows if name == "plain"}
    print(f"{'MB':>6} {'method':<14} {'median s':>10} {'MB/s':>9} {'x plain':>8}")
    for size, name, t in rows:
        print(
            f"{size:>6} {name:<14} {t:>10.4f} {size / t:>9.1f} {t / plain[size]:>8.2f}"
        )


if __name__ == "__main__":
    main()
