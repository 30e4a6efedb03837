"""Wall time of a real ``dp --pt-expt train`` with and without the plugin.

The example system is trained with ``save_freq: 1`` (a checkpoint every step,
the worst case for checkpoint overhead) by plain deepmd-kit
(``DP_CKPT_DISABLE=1``) and through the plugin, interleaved ``--repeat`` times
in one run; the medians of the whole command and of the training loop alone
(from deepmd-kit's own log) are printed with their ratio. Run::

    .venv/bin/python benchmarks/bench_dp_train.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
THREADS = {
    "OMP_NUM_THREADS": "1",
    "DP_INTRA_OP_PARALLELISM_THREADS": "1",
    "DP_INTER_OP_PARALLELISM_THREADS": "1",
}


def prepare(work: Path, steps: int) -> None:
    """Make the example data and an input saving every step."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "make_data.py"),
            "--out",
            str(work / "data"),
        ],
        check=True,
    )
    config = json.loads((ROOT / "examples" / "input.json").read_text())
    config["training"].update(
        numb_steps=steps, save_freq=1, disp_freq=steps, max_ckpt_keep=3
    )
    (work / "input.json").write_text(json.dumps(config))


def run_once(work: Path, plugin: bool) -> tuple[float, float]:
    """Train from scratch in ``work``; return (command seconds, seconds in the loop)."""
    for name in ("models", "checkpoint", "model.ckpt.pt", "lcurve.out"):
        path = work / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    env = {**os.environ, **THREADS}
    if not plugin:
        env["DP_CKPT_DISABLE"] = "1"
    t0 = time.perf_counter()
    out = subprocess.run(
        [str(BIN / "dp"), "--pt-expt", "train", "input.json", "--skip-neighbor-stat"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    total = time.perf_counter() - t0
    stamps = re.findall(
        r"\[(\d+-\d+-\d+ \d+:\d+:\d+,\d+)\].*(?:Start to train|Trained model has been saved)",
        out.stderr + out.stdout,
    )
    loop = float("nan")
    if len(stamps) == 2:
        from datetime import datetime

        a, b = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in stamps)
        loop = (b - a).total_seconds()
    return total, loop


def main() -> None:
    """Run both variants interleaved and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, args.steps)
        results: dict[str, list[tuple[float, float]]] = {"deepmd-kit": [], "plugin": []}
        for _ in range(args.repeat):
            results["deepmd-kit"].append(run_once(work, plugin=False))
            results["plugin"].append(run_once(work, plugin=True))
    med = {
        k: (
            statistics.median(t for t, _ in v),
            statistics.median(loop for _, loop in v),
        )
        for k, v in results.items()
    }
    base_total, base_loop = med["deepmd-kit"]
    print(f"{args.steps} steps, a checkpoint every step, {args.repeat} runs each")
    print(f"{'variant':<12} {'command s':>10} {'x':>6} {'train loop s':>13} {'x':>6}")
    for name, (total, loop) in med.items():
        print(
            f"{name:<12} {total:>10.2f} {total / base_total:>6.2f} {loop:>13.2f} {loop / base_loop:>6.2f}"
        )


if __name__ == "__main__":
    main()
