"""Importing the package (and every light module) must not import torch or deepmd."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIGHT = [
    "dp_ckpt_plugin",
    "dp_ckpt_plugin.formats.torch",
    "dp_ckpt_plugin.formats.hdf5",
    "dp_ckpt_plugin.store.core",
    "dp_ckpt_plugin.plugin",
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


def run_probe(code: str, **env: str) -> str:
    import os

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return out.stdout.strip()


#: The deepmd-kit keys taken over, and the ones left alone.
TAKEN = ("pt-expt", "pytorch-exportable", "pt", "pytorch")
UNTOUCHED = ("tf", "tensorflow", "jax", "pd", "paddle")

PROBE = (
    "import sys\n"
    "import deepmd.backend\n"
    "from deepmd.backend.backend import Backend\n"
    "backends = Backend.get_backends()\n"
    f"print(' '.join(backends[k].__module__ for k in {TAKEN!r}))\n"
    "print(sorted(m for m in sys.modules if m.startswith(('torch', 'dp_ckpt'))))\n"
    f"print(' '.join(backends[k].__module__ for k in {UNTOUCHED!r} if k in backends))\n"
)


def test_deepmd_backend_entry_point_is_light_and_takes_over_pt_expt_and_pt():
    pytest.importorskip("deepmd")
    keys, loaded, untouched = run_probe(PROBE).splitlines()
    assert keys.split() == ["dp_ckpt_plugin.deepmd.takeover"] * 4
    # the entry point loads the tiny modules that declare the hosts, and no
    # torch; and the one that keeps every log line of the package one line
    assert loaded == str(
        [
            "dp_ckpt_plugin",
            "dp_ckpt_plugin.deepmd",
            "dp_ckpt_plugin.deepmd.host",
            "dp_ckpt_plugin.deepmd.pt",
            "dp_ckpt_plugin.deepmd.pt_expt",
            "dp_ckpt_plugin.deepmd.takeover",
            "dp_ckpt_plugin.text",
        ]
    )
    assert "dp_ckpt" not in untouched  # --tf, --jax, --pd are deepmd-kit's own


def test_dp_ckpt_disable_keeps_deepmds_backend():
    pytest.importorskip("deepmd")
    keys, _, _ = run_probe(PROBE, DP_CKPT_DISABLE="1").splitlines()
    assert keys.split() == [
        "deepmd.backend.pt_expt",
        "deepmd.backend.pt_expt",
        "deepmd.backend.pytorch",
        "deepmd.backend.pytorch",
    ]


def test_another_deepmd_version_keeps_deepmds_backends_and_says_so_once():
    """The version guard (issue 9, item 2): one line, nothing registered."""
    pytest.importorskip("deepmd")
    import os

    code = "import deepmd\ndeepmd.__version__ = '3.1.3'\n" + PROBE
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DP_CKPT_DISABLE": ""},
    )
    keys, loaded, _ = done.stdout.strip().splitlines()
    assert keys.split()[0] == "deepmd.backend.pt_expt"
    assert keys.split()[2] == "deepmd.backend.pytorch"
    assert "torch" not in loaded
    notes = [line for line in done.stderr.splitlines() if "dp_ckpt_plugin" in line]
    assert len(notes) == 1, done.stderr
    assert "supports deepmd-kit 3.2.x, found 3.1.3: the plugin is off" in notes[0]


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("3.2.0", True),
        ("3.2.1", True),
        ("3.2.0rc1", True),
        ("3.2.1.dev4+g1234abc", True),
        ("3.1.3", False),
        ("3.3.0", False),
        ("4.2.0", False),
        ("unknown", False),
        ("", False),
    ],
)
def test_supported_versions(version, supported):
    from dp_ckpt_plugin.deepmd.takeover import is_supported

    assert is_supported(version) is supported


def _imports_of_the_package():
    """Every ``from X import names`` of the package naming one of its modules."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "dp_ckpt_plugin").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        package = parts[:-1]  # a module's package, or the package itself
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ((node.module,) if node.module else ()))
            else:
                target = node.module or ""
            if target.split(".")[0] == "dp_ckpt_plugin":
                names = [a.name for a in node.names]
                yield f"{path.relative_to(root)}:{node.lineno}", target, names


def test_every_import_of_the_package_names_what_is_there():
    """Imports inside functions too (ruff does not resolve them): a name moved
    or removed must not leave a command that fails only when it runs. Checked
    in a child process: the host's modules import deepmd-kit."""
    import json

    imports = list(_imports_of_the_package())
    code = (
        "import importlib, json, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "missing = []\n"
        "for where, target, names in json.loads(sys.stdin.read()):\n"
        "    module = importlib.import_module(target)\n"
        "    for name in names:\n"
        "        if hasattr(module, name):\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(target + '.' + name)\n"
        "        except ModuleNotFoundError:\n"
        "            missing.append(where + ': ' + target + '.' + name)\n"
        "print(json.dumps(missing))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(imports),
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(imports) > 500  # the walk found the package's imports
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_a_background_save_of_a_numpy_state_does_not_import_torch(tmp_path):
    """The CUDA side of a snapshot is entered only for a CUDA tensor: an HDF5
    loop without torch saves in the background without it."""
    code = (
        "import sys, numpy as np\n"
        "from dp_ckpt_plugin import CheckpointManager\n"
        f"with CheckpointManager({str(tmp_path)!r}, format='hdf5', async_save=True) as m:\n"
        "    m.save(1, {'w': np.ones(3)})\n"
        "    m.wait()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False"]
