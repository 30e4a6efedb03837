"""Shared fixtures: plugin managers and checkpoint managers (see ``helpers.py``),
and a real S3 endpoint (see ``s3_server.py``)."""

from __future__ import annotations

import os

import pytest

# the comparisons in helpers.py report their operands like a test's own asserts
pytest.register_assert_rewrite("helpers")

from helpers import free_port, open_manager, plugin_manager  # noqa: E402


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


# -- a real S3 endpoint (moto's server; see s3_server.py) ------------------------


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1, for the session (skips without moto)."""
    from s3_server import MISSING, S3Server

    if MISSING:
        pytest.skip(MISSING)
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """The AWS variables of one test: the server, fake keys, the region.

    Nothing of the machine's own AWS settings is seen (``HOME`` is the
    test's), and the instance metadata service is never asked.
    """
    from s3_server import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # should anything still ask the metadata service, it asks a closed port here
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    s3_server.start()  # a test that stopped it and failed leaves it stopped
    return s3_server


@pytest.fixture
def s3_bucket(s3_env):
    """A fresh bucket (and the prefix ``run``), emptied and removed afterwards."""
    from s3_server import S3Bucket

    bucket = S3Bucket(s3_env, s3_env.make_bucket())
    yield bucket
    s3_env.start()
    s3_env.remove_bucket(bucket.name)


@pytest.fixture
def fault_proxy(s3_env):
    """A proxy in front of the S3 server that fails chosen requests."""
    from s3_server import FaultProxy

    proxy = FaultProxy(s3_env)
    yield proxy
    proxy.close()
