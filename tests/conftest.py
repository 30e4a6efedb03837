"""Shared fixtures: plugin managers and checkpoint managers (see ``helpers.py``),
and a real S3 endpoint (see ``s3_server.py``)."""

from __future__ import annotations

import ast
import functools
import json
import os
from pathlib import Path

import pytest

# the comparisons in helpers.py report their operands like a test's own asserts
pytest.register_assert_rewrite("helpers")

from doubles.memory import serve_memory  # noqa: E402
from helpers import free_port, open_manager, plugin_manager  # noqa: E402

serve_memory()  # memory:// URLs, for every test

# -- running on several workers (pytest -n, pytest-xdist) -------------------------

_SHARED_SCOPES = ("module", "class", "package")

DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each slow test took (setup, call and teardown) in a recorded run:
what orders the tests, slowest first. ``pytest --record-durations`` writes it."""

_UNRECORDED = {"e2e": 10.0, "torture": 5.0}
"""Seconds assumed for a test the record does not have, by mark (else 0)."""


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write the durations of the tests that took 1 s or more to {DURATIONS.name}",
    )


@functools.cache
def _keeps_whole(root: Path, module: str) -> bool:
    """Whether the test module ``module`` (a node id's path) defines a module-,
    class- or package-scoped fixture: then one worker runs all its tests."""
    try:
        tree = ast.parse((root / module).read_text("utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (
            getattr(node.func, "attr", None) == "fixture"
            or getattr(node.func, "id", None) == "fixture"
        ):
            for keyword in node.keywords:
                value = keyword.value
                if (
                    keyword.arg == "scope"
                    and isinstance(value, ast.Constant)
                    and value.value in _SHARED_SCOPES
                ):
                    return True
    return False


def _recorded() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text("utf-8"))
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: a module that shares module- or class-scoped
    fixtures (a trained run, a built documentation) is one piece of work,
    run by one worker, so the fixture is made once, not once per worker;
    any other test is a piece of its own, for whichever worker is free.
    (``xdist_group`` marks still group as they do.) The run's shared
    trainings (``shared_trained``) are shared across workers through a lock
    file instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            if scope != nodeid:  # an xdist_group mark's
                return scope
            module = nodeid.split("::", 1)[0]
            return module if _keeps_whole(config.rootpath, module) else nodeid

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """Start the slowest work first.

    The pieces of work (a module kept whole, see
    :func:`pytest_xdist_make_scheduler`, or one test) are dealt out slowest
    first, by the seconds :data:`DURATIONS` records (:data:`_UNRECORDED` for
    a test it does not have), each module keeping its own order: the small
    ones fill in behind the big ones, so the workers end together.
    """
    recorded = _recorded()

    def seconds(item: pytest.Item) -> float:
        if item.nodeid in recorded:
            return recorded[item.nodeid]
        marks = [m for m in _UNRECORDED if item.get_closest_marker(m)]
        return max((_UNRECORDED[m] for m in marks), default=0.0)

    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        whole = _keeps_whole(config.rootpath, module)
        units.setdefault(module if whole else item.nodeid, []).append(item)
    ordered = sorted(
        units.values(), key=lambda unit: sum(map(seconds, unit)), reverse=True
    )
    items[:] = [item for unit in ordered for item in unit]


_TOOK: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        # under loadgroup a grouped test's id ends in @<group>
        nodeid = report.nodeid
        if nodeid.rfind("@") > nodeid.rfind("]"):
            nodeid = nodeid.rsplit("@", 1)[0]
        _TOOK[nodeid] = _TOOK.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    config = session.config
    if not config.getoption("record_durations") or hasattr(config, "workerinput"):
        return
    durations = {k: v for k, v in _recorded().items() if k not in _TOOK}
    durations.update({k: round(v, 1) for k, v in _TOOK.items() if v >= 1.0})
    text = json.dumps(dict(sorted(durations.items())), indent=1)
    DURATIONS.write_text(text + "\n", "utf-8")


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
    """After a module that ran commands (``e2e_support.run``), print each one's
    wall time (and add them to the file ``E2E_TIMINGS`` names, if set)."""
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
    # pytest -n shows no worker's output: E2E_TIMINGS names a file to add them to
    if os.environ.get("E2E_TIMINGS"):
        with open(os.environ["E2E_TIMINGS"], "a", encoding="utf-8") as out:
            out.writelines(f"{s:.1f}\t{label}\n" for label, s in rows)


# -- the shared trainings of the end-to-end tests (see e2e_support.py) -----------


@pytest.fixture(scope="session")
def shared_trained(tmp_path_factory):
    """``shared_trained(backend)``: the run's one shared training of ``backend``.

    Trained on first use, once per test run: the workers of ``pytest -n``
    share it through a directory of the run and a lock file
    (``e2e_support.shared_training``). Read it, never change it; a test that
    changes a store takes :func:`trained_copy`.
    """
    from e2e_support import shared_training

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    root = root / "shared_trained"
    root.mkdir(exist_ok=True)
    return lambda backend: shared_training(root, backend)


@pytest.fixture
def trained_copy(shared_trained, tmp_path):
    """``trained_copy(backend="pt-expt", name="trained")``: a copy of the shared
    training of ``backend`` in this test's ``tmp_path / name``."""
    from e2e_support import copy_tree

    def copy(backend: str = "pt-expt", name: str = "trained"):
        return copy_tree(shared_trained(backend), tmp_path / name)

    return copy


@pytest.fixture
def mem():
    """An in-process object storage at ``memory://<a new bucket>/run``, forgotten after."""
    import secrets

    from doubles.memory import MemoryStorage, forget

    bucket = f"m{secrets.token_hex(4)}"
    yield MemoryStorage(f"memory://{bucket}/run")
    forget(bucket)


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
