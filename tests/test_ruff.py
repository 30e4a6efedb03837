"""Ruff runs as part of the tests: lint and format of the whole project."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed; install the [test] extra")
    return [found]


@pytest.mark.parametrize(
    "args", [["check"], ["format", "--check"]], ids=["lint", "format"]
)
def test_ruff(args):
    out = subprocess.run(
        [*ruff(), *args, "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
