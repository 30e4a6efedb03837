"""Shared fixtures: plugin managers and checkpoint managers (see ``helpers.py``)."""

from __future__ import annotations

import pytest

# the comparisons in helpers.py report their operands like a test's own asserts
pytest.register_assert_rewrite("helpers")

from helpers import open_manager, plugin_manager  # noqa: E402


@pytest.fixture
def pm():
    """A fresh plugin manager without third-party entry points."""
    return plugin_manager()


@pytest.fixture
def make_manager(tmp_path, pm):
    """Build managers on ``tmp_path/models``; close them all afterwards.

    ``make(directory=None, format="hdf5", **kwargs)``: the keyword arguments of
    :class:`CheckpointManager`, ``pm`` being this test's by default.
    """
    made = []

    def make(directory=None, *, format="hdf5", **kwargs):
        kwargs.setdefault("pm", pm)
        m = open_manager(directory or tmp_path / "models", format, **kwargs)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()
