"""The README's NumPy example: killed mid-run, it resumes from ``latest``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "numpy_train.py"


def run(cwd, *args):
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--save-dir", "models", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def test_killed_loop_resumes_from_latest(tmp_path):
    killed = run(tmp_path, "--steps", "100", "--save-freq", "20", "--kill-at", "70")
    assert killed.returncode == -9, killed.stderr
    assert "saved" in killed.stdout and "step    80" not in killed.stdout
    resumed = run(
        tmp_path, "--steps", "120", "--save-freq", "20", "--restart", "latest"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"resumed from {tmp_path / 'models' / 'model.ckpt-60.h5'} at step 60"
        in resumed.stdout
    )
    assert "step    80" in resumed.stdout and "step   120" in resumed.stdout
    assert (
        tmp_path / "models" / "checkpoint"
    ).read_text().strip() == "model.ckpt-120.h5"


def test_bad_restart_is_one_message(tmp_path):
    out = run(tmp_path, "--restart", "nowhere")
    assert out.returncode == 1
    assert out.stderr.startswith("error: no checkpoint found for restart 'nowhere'")
    assert "Traceback" not in out.stderr
