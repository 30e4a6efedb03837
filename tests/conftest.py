"""Shared fixtures: plugin managers and small payloads."""

from __future__ import annotations

import numpy as np
import pytest

from dp_ckpt_plugin import CheckpointManager, get_plugin_manager


def payload(step: int, size: int = 16) -> dict:
    """Return a small payload whose content is a function of ``step``."""
    rng = np.random.default_rng(step)
    return {
        "w": rng.standard_normal(size),
        "step": np.int64(step),
        "tag": f"step-{step}",
    }


@pytest.fixture
def pm():
    """A fresh plugin manager without third-party entry points."""
    return get_plugin_manager(entry_points=False)


@pytest.fixture
def make_manager(tmp_path, pm):
    """Build managers on ``tmp_path/models``; close them all afterwards."""
    made = []

    def make(directory=None, **kwargs):
        kwargs.setdefault("pm", pm)
        kwargs.setdefault("format", "hdf5")
        m = CheckpointManager(directory or tmp_path / "models", **kwargs)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()
