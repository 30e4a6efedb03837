"""Every performance figure of dp_ckpt_plugin, measured side by side in one run.

Each section interleaves its variants round by round (A, B, C, A, B, C, ...)
so that a disturbance of the machine hits all of them alike, and prints the
median of the rounds and the ratios that the targets are stated in. Run::

    .venv/bin/python benchmarks/run.py              # everything (~10 min)
    .venv/bin/python benchmarks/run.py --quick      # smaller sizes, fewer rounds
    .venv/bin/python benchmarks/run.py --only save  # one section

Sections: ``save`` (durable save bandwidth against the raw fsynced write and
plain ``torch.save``), ``async`` (the training loop's stall), ``count`` (save
and ``latest`` with 10, 1,000 and 10,000 checkpoints kept), ``digest`` (the
hash algorithms), ``dp`` (real ``dp --pt-expt train`` with ``save_freq: 1``),
``import`` (the ``deepmd.backend`` entry point). Results are summarized in
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
THREADS = {
    "OMP_NUM_THREADS": "1",
    "DP_INTRA_OP_PARALLELISM_THREADS": "1",
    "DP_INTER_OP_PARALLELISM_THREADS": "1",
}
RESULTS: list[dict] = []


def interleaved(variants: dict[str, Callable[[], float | None]], rounds: int) -> dict:
    """Run each variant once per round, in turn; return the median seconds of each.

    A variant returns its own measured seconds, or ``None`` to be timed whole.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            measured = fn()
            elapsed = time.perf_counter() - start
            times[name].append(measured if measured is not None else elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def report(section: str, label: str, value: float, target: str, ok: bool) -> None:
    verdict = "met" if ok else "MISSED"
    print(f"  {label:58s} {value:8.3f}   target {target:10s} {verdict}")
    RESULTS.append(
        {
            "section": section,
            "figure": label,
            "value": value,
            "target": target,
            "met": ok,
        }
    )


# -- durable save bandwidth ---------------------------------------------------------


def make_state(mib: int):
    import torch

    n = mib * (1 << 20) // 4
    gen = torch.Generator().manual_seed(mib)
    weights = torch.randn(n, generator=gen)
    half = n // 2
    return {
        "model": {"w1": weights[:half].clone(), "w2": weights[half:].clone()},
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
    }


def store_for(directory: Path, *, keep: int = 2, durable: bool = True):
    from dp_ckpt_plugin import (
        CheckpointStore,
        FamilyConfig,
        KeepLast,
        get_plugin_manager,
    )
    from dp_ckpt_plugin.layout import Family

    pm = get_plugin_manager(entry_points=False)
    family = FamilyConfig(Family("model.ckpt", ".pt"), KeepLast(keep))
    return CheckpointStore(
        directory, format="torch", pm=pm, families=[family], durable=durable
    )


def section_save(work: Path, sizes: list[int], rounds: int) -> None:
    import io

    import torch

    print("\n[save] durable synchronous save against the raw fsynced write")
    for mib in sizes:
        state = make_state(mib)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        step = [0]
        store = store_for(work / f"store-{mib}")

        def raw(mib=mib, data=data):
            path = work / f"raw-{mib}.bin"
            with open(path, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            path.unlink()

        def plain(mib=mib, state=state):
            path = work / f"plain-{mib}.pt"
            torch.save(state, path)  # deepmd-kit 3.2: not atomic, not durable
            path.unlink()

        def plugin(store=store, state=state, step=step):
            step[0] += 1
            store.save(step[0], state)

        med = interleaved({"raw": raw, "plain": plain, "plugin": plugin}, rounds)
        store.close()
        shutil.rmtree(work / f"store-{mib}")
        print(
            f"  {mib} MiB: raw write+fsync {med['raw'] * 1e3:.0f} ms, "
            f"plain torch.save {med['plain'] * 1e3:.0f} ms, "
            f"plugin save {med['plugin'] * 1e3:.0f} ms"
        )
        fraction = med["raw"] / med["plugin"]
        report(
            "save",
            f"{mib} MiB durable save, fraction of raw write bandwidth",
            fraction,
            ">= 0.80",
            fraction >= 0.80,
        )
        print(
            f"  {'':58s} {med['plugin'] / med['plain']:8.3f}   (plugin / plain torch.save)"
        )


def section_async(work: Path, sizes: list[int], rounds: int) -> None:
    import torch

    print("\n[async] the training loop's stall: async save against plain torch.save")
    for mib in sizes:
        state = make_state(mib)
        store = store_for(work / f"async-{mib}")
        step = [0]

        def plain(mib=mib, state=state):
            path = work / f"plain-{mib}.pt"
            torch.save(state, path)
            path.unlink()

        def stall(store=store, state=state, step=step):
            step[0] += 1
            start = time.perf_counter()
            store.save(step[0], state, background=True)
            seconds = time.perf_counter() - start
            store.wait()  # outside the stall: the next round starts idle
            return seconds

        med = interleaved({"plain": plain, "stall": stall}, rounds)
        store.close()
        shutil.rmtree(work / f"async-{mib}")
        ratio = med["stall"] / med["plain"]
        print(
            f"  {mib} MiB: plain torch.save {med['plain'] * 1e3:.0f} ms, "
            f"async stall {med['stall'] * 1e3:.1f} ms"
        )
        report(
            "async",
            f"{mib} MiB async stall / plain torch.save",
            ratio,
            "<= 0.15",
            ratio <= 0.15,
        )


# -- bookkeeping with many checkpoints ------------------------------------------------


def section_count(work: Path, counts: list[int], rounds: int) -> None:
    import torch

    from dp_ckpt_plugin import (
        CheckpointStore,
        FamilyConfig,
        KeepAll,
        get_plugin_manager,
    )
    from dp_ckpt_plugin.layout import Family

    print("\n[count] save and resolve('latest') with many checkpoints kept (keep all)")
    pm = get_plugin_manager(entry_points=False)
    family = [FamilyConfig(Family("model.ckpt", ".pt"), KeepAll())]
    tiny = {"w": torch.zeros(16)}
    stores = {}
    for n in counts:
        directory = work / f"count-{n}"
        with CheckpointStore(
            directory, format="torch", pm=pm, families=family, durable=False
        ) as filler:
            for step in range(1, n + 1):
                filler.save(step, tiny)
        store = CheckpointStore(directory, format="torch", pm=pm, families=family)
        start = time.perf_counter()
        store.resolve("latest")  # the run continues: nothing is archived
        store.save(n + 1, tiny)  # opens: lock, sweep, catalogue read once
        print(
            f"  {n:6d} kept: resolve latest and the first save (opens the store) "
            f"{1e3 * (time.perf_counter() - start):.1f} ms"
        )
        stores[n] = store
    steps = {n: n + 1 for n in counts}

    def saver(n):
        def save():
            steps[n] += 1
            stores[n].save(steps[n], tiny)

        return save

    def resolver(n):
        def latest():
            stores[n].resolve("latest")

        return latest

    variants = {f"save-{n}": saver(n) for n in counts}
    variants.update({f"latest-{n}": resolver(n) for n in counts})
    med = interleaved(variants, rounds)
    for store in stores.values():
        store.close()
    base = min(counts)
    for n in counts:
        print(
            f"  {n:6d} kept: save {med[f'save-{n}'] * 1e3:.2f} ms, "
            f"latest {med[f'latest-{n}'] * 1e6:.0f} us"
        )
    top = max(counts)
    ratio = med[f"save-{top}"] / med[f"save-{base}"]
    report(
        "count", f"save with {top} kept / with {base}", ratio, "<= 1.2", ratio <= 1.2
    )
    ratio = med[f"latest-{top}"] / med[f"latest-{base}"]
    report(
        "count", f"latest with {top} kept / with {base}", ratio, "<= 1.2", ratio <= 1.2
    )


# -- digest algorithms ----------------------------------------------------------------


def section_digest(work: Path, mib: int, rounds: int) -> None:
    print(f"\n[digest] hashing {mib} MiB (one thread), the candidates for the record")
    data = os.urandom(mib << 20)
    candidates = {"sha256": hashlib.sha256}
    try:
        import blake3

        candidates["blake3"] = blake3.blake3
    except ImportError:
        pass
    try:
        import xxhash

        candidates["xxh3_128 (not cryptographic)"] = xxhash.xxh3_128
    except ImportError:
        print("  (xxhash not installed: pip install xxhash to compare it)")

    def hashing(make):
        def run():
            make(data).digest()  # returns None: the call is timed whole

        return run

    variants = {name: hashing(make) for name, make in candidates.items()}
    med = interleaved(variants, rounds)
    for name, seconds in med.items():
        print(f"  {name:30s} {mib / 1024 / seconds:6.2f} GiB/s")


# -- real dp training ----------------------------------------------------------------


def prepare_dp(work: Path, steps: int) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "make_data.py"),
            "--out",
            str(work / "data"),
        ],
        check=True,
        capture_output=True,
    )
    config = json.loads((ROOT / "examples" / "input.json").read_text())
    config["training"].update(
        numb_steps=steps, save_freq=1, disp_freq=steps, max_ckpt_keep=3
    )
    for name, extra in (("sync", {}), ("async", {"async_save": True})):
        (work / f"{name}.json").write_text(json.dumps({**config, "dp_ckpt": extra}))
    plain = dict(config)
    (work / "off.json").write_text(json.dumps(plain))


_STAMP = re.compile(
    r"\[(\d+-\d+-\d+ \d+:\d+:\d+,\d+)\].*(?:Start to train|Trained model has been saved)"
)


def dp_loop_seconds(work: Path, variant: str) -> float:
    """Train from scratch; return the seconds of deepmd-kit's training loop."""
    from datetime import datetime

    for name in ("models", "checkpoint", "model.ckpt.pt", "lcurve.out"):
        path = work / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    env = {**os.environ, **THREADS}
    if variant == "off":
        env["DP_CKPT_DISABLE"] = "1"
    out = subprocess.run(
        [
            str(BIN / "dp"),
            "--pt-expt",
            "train",
            f"{variant}.json",
            "--skip-neighbor-stat",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    stamps = _STAMP.findall(out.stderr + out.stdout)
    first, last = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in stamps[:2])
    return (last - first).total_seconds()


def section_dp(work: Path, steps: int, rounds: int) -> None:
    print(f"\n[dp] dp --pt-expt train, {steps} steps, a checkpoint every step")
    work = work / "dp"
    work.mkdir()
    prepare_dp(work, steps)
    dp_loop_seconds(work, "off")  # warm the caches
    med = interleaved(
        {v: (lambda v=v: dp_loop_seconds(work, v)) for v in ("off", "sync", "async")},
        rounds,
    )
    for variant, seconds in med.items():
        print(f"  training loop, plugin {variant:5s}: {seconds:6.2f} s")
    ratio = med["async"] / med["off"]
    report(
        "dp", "training loop, async save / plugin off", ratio, "<= 1.05", ratio <= 1.05
    )
    ratio = med["sync"] / med["off"]
    report("dp", "training loop, sync save / plugin off", ratio, "(none)", True)


# -- the entry point -------------------------------------------------------------------


def section_import(rounds: int) -> None:
    print("\n[import] the deepmd.backend entry point, in a fresh process each time")
    code = (
        "import importlib, sys, time\n"
        "import deepmd.backend\n"
        "torch = 'torch' in sys.modules\n"
        "ours = [m for m in sys.modules if m.startswith('dp_ckpt_plugin')]\n"
        "for name in ours:\n"
        "    del sys.modules[name]\n"
        "start = time.perf_counter()\n"
        "importlib.import_module('dp_ckpt_plugin.deepmd.takeover')\n"
        "print(time.perf_counter() - start, torch, len(ours))\n"
    )
    seconds = []
    torch_loaded = False
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        value, loaded, count = out.stdout.split()
        assert int(count) > 0, "the entry point was not loaded"
        seconds.append(float(value))
        torch_loaded |= loaded == "True"
    median_ms = statistics.median(seconds) * 1e3
    report(
        "import",
        "entry point: executing the plugin's modules, ms",
        median_ms,
        "<= 20",
        median_ms <= 20 and not torch_loaded,
    )
    print(
        f"  torch imported by 'import deepmd.backend' with the plugin: {torch_loaded}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["save", "async", "count", "digest", "dp", "import"],
        help="run only these sections",
    )
    parser.add_argument("--rounds", type=int, help="rounds per section")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sections = args.only or ["save", "async", "count", "digest", "dp", "import"]
    rounds = args.rounds or (3 if args.quick else 7)
    sizes = [16, 64] if args.quick else [64, 512]
    counts = [10, 1000] if args.quick else [10, 1000, 10000]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {rounds} rounds")
    with tempfile.TemporaryDirectory(dir=ROOT, prefix=".bench-") as tmp:
        work = Path(tmp)
        if "save" in sections:
            section_save(work, sizes, rounds)
        if "async" in sections:
            section_async(work, sizes, rounds)
        if "count" in sections:
            section_count(work, counts, max(rounds, 15))
        if "digest" in sections:
            section_digest(work, 64 if args.quick else 256, rounds)
        if "dp" in sections:
            section_dp(work, 10 if args.quick else 40, max(3, rounds // 2))
        if "import" in sections:
            section_import(max(rounds, 5))
    if args.json:
        args.json.write_text(json.dumps(RESULTS, indent=1) + "\n")
    missed = [r["figure"] for r in RESULTS if not r["met"]]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
