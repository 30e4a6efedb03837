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


@pytest.fixture(scope="module", autouse=True)
def timing_summary():
    """After a module that ran commands (``e2e_support.run``), print each one's wall time."""
    from e2e_support import TIMINGS

    first = len(TIMINGS)
    yield
    rows = TIMINGS[first:]
    if not rows:
        return
    print("\n[e2e] wall time of each command:")
    for label, seconds in rows:
        print(f"[e2e] {seconds:6.1f} s  {label}")
    print(f"[e2e] {sum(s for _, s in rows):6.1f} s  in all ({len(rows)} commands)")
