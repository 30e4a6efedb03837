"""Importing the package (and every light module) must not import torch or deepmd."""

from __future__ import annotations

import subprocess
import sys

LIGHT = [
    "dp_ckpt_plugin",
    "dp_ckpt_plugin.backends.torch",
    "dp_ckpt_plugin.backends.hdf5",
    "dp_ckpt_plugin.store",
    "dp_ckpt_plugin.plugins",
]


def test_light_imports_do_not_pull_heavy_modules():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in LIGHT)
        + "from dp_ckpt_plugin import get_plugin_manager\n"
        + "get_plugin_manager()\n"
        + "heavy = [m for m in ('torch', 'deepmd', 'h5py') if m in sys.modules]\n"
        + "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
