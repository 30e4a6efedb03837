"""Every example input passes our schema and, unchanged, DeePMD-kit's.

The plugin's options live in ``training._dp_ckpt``, which DeePMD-kit's strict
check lets through (keys beginning with ``_`` are comments to it): an input
that runs with the plugin runs unchanged without it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from dargs.dargs import ArgumentKeyError

from dp_ckpt_plugin.deepmd.argcheck import (
    OLD_SECTION,
    SECTION,
    check_save_dir,
    plugin_options,
)
from dp_ckpt_plugin.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
INPUTS = sorted(EXAMPLES.rglob("*.json"))
FULL_SECTION = {
    "verify": "size",
    "lock": True,
    "fsync": False,
    "quarantine": True,
    "check_free_space": True,
    "compat_links": False,
    "async_save": False,
    "stop_signals": ["SIGTERM", "SIGUSR1", "SIGINT"],
}


def load(path: Path) -> dict:
    """Read one example input."""
    return json.loads(path.read_text("utf-8"))


def deepmd_normalize(config: dict) -> dict:
    """Check an input as ``dp train`` of DeePMD-kit 3.2.0 does (strict)."""
    argcheck = pytest.importorskip("deepmd.utils.argcheck")
    compat = pytest.importorskip("deepmd.utils.compat")
    multi_task = "model_dict" in config.get("model", {})
    if multi_task:  # as dp --pt train does first: resolve the shared_dict references
        multi = pytest.importorskip("deepmd.pt.utils.multi_task")
        config["model"], _ = multi.preprocess_shared_params(config["model"])
    config = compat.update_deepmd_input(config, warning=False, dump=None)
    return argcheck.normalize(config, multi_task=multi_task)


def example_id(path: Path) -> str:
    return str(path.relative_to(EXAMPLES))


def test_there_are_examples():
    assert EXAMPLES / "input.json" in INPUTS


@pytest.mark.parametrize("path", INPUTS, ids=example_id)
def test_example_passes_our_schema(path, tmp_path, monkeypatch):
    config = load(path)
    plugin_options(config)
    assert OLD_SECTION not in config
    monkeypatch.chdir(tmp_path)
    check_save_dir(config.get("training", {}).get("save_dir"))
    assert list(tmp_path.iterdir()) == [], "checking save_dir created something"


@pytest.mark.parametrize("path", INPUTS, ids=example_id)
def test_example_passes_deepmd_strict_check_unchanged(path):
    config = load(path)
    plugin_options(copy.deepcopy(config))
    deepmd_normalize(config)


@pytest.mark.parametrize("path", INPUTS, ids=example_id)
def test_example_with_every_option_passes_both(path):
    config = load(path)
    config["training"][SECTION] = dict(FULL_SECTION)
    options = plugin_options(config)
    assert options.verify == "size"
    assert not options.compat_links
    assert options.stop_signals == ("SIGTERM", "SIGUSR1", "SIGINT")
    normalized = deepmd_normalize(config)  # the section left in place
    assert SECTION not in normalized["training"]


def test_deepmd_rejects_the_old_top_level_section():
    """Why ``dp_ckpt`` moved: DeePMD-kit alone refuses it at the top level."""
    config = load(EXAMPLES / "input.json")
    config["training"].pop(SECTION, None)
    config[OLD_SECTION] = dict(FULL_SECTION)
    with pytest.raises(ArgumentKeyError, match=OLD_SECTION):
        deepmd_normalize(copy.deepcopy(config))
    with pytest.raises(
        ConfigError,
        match=r"^the top-level `dp_ckpt` section is `training\._dp_ckpt` since 0\.3$",
    ):
        plugin_options(config)  # the plugin names where it goes
