"""The registry from URL scheme to storage, and storages offered by plugins.

Built-in schemes give their storage; an unknown one is one line listing the
known ones; a plugin offers a scheme through ``register_storages``, on the
process's plugin manager or installed through the ``dp_ckpt`` entry-point
group (a ``.dist-info`` folder on ``sys.path`` of a child process, as
``pip install`` leaves it), loaded only when a scheme is not a built-in one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from doubles.memory import MemoryStorage
from helpers import open_manager
from s3_server import MISSING

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.objectstore import registry
from dp_ckpt_plugin.objectstore.registry import local_path, scheme_of, storage_for
from dp_ckpt_plugin.plugin import ENTRY_POINT_GROUP
from dp_ckpt_plugin.storage import local_storage
from dp_ckpt_plugin.storage.objects import ObjectStorage


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        ("s3://b/p", "s3"),
        ("S3://b/p", "s3"),
        ("gs://b", "gs"),
        ("file:///tmp/x", "file"),
        ("memory://b", "memory"),
        ("my+fs.v2://x", "my+fs.v2"),
        ("/plain/path", ""),
        ("relative/path", ""),
        ("C:\\models", ""),
        ("models:with:colons", ""),
        (Path("/a/b"), ""),
    ],
)
def test_scheme_of(text, scheme):
    assert scheme_of(text) == scheme


def test_plain_paths_and_file_urls_are_local_not_object_storages(tmp_path):
    for given in (tmp_path / "a", str(tmp_path / "b"), f"file://{tmp_path}/c"):
        assert Path(local_path(given)) == tmp_path / Path(str(given)).name
        with pytest.raises(ConfigError) as raised:
            storage_for(given)
        assert str(raised.value).endswith(
            ": a local path is a directory store, not an object storage"
        )
    spaced = local_path(f"file://localhost{tmp_path}/with%20space")
    assert Path(spaced) == tmp_path / "with space"


LOCATIONS = [
    ("file:///x/models", "/x/models"),
    ("file://localhost/x/models", "/x/models"),
    ("FILE://LOCALHOST/x/with%20space", "/x/with space"),
    ("file:x", "file:x"),  # no // : a relative path, like any other
    ("runs/models", "runs/models"),
    ("/x/models", "/x/models"),
    (Path("runs/models"), "runs/models"),
    ("s3://bucket/run", None),
    ("memory://b/run", None),
]


@pytest.mark.parametrize(("given", "path"), LOCATIONS, ids=str)
def test_one_parser_reads_every_location(given, path):
    assert local_path(given) == path


@pytest.mark.parametrize(("given", "path"), LOCATIONS[:6], ids=str)
def test_every_reader_of_a_location_agrees(given, path, tmp_path, monkeypatch):
    """The storage, save_dir, the manager and the commands: one answer each."""
    from dp_ckpt_plugin.commands import store_directory
    from dp_ckpt_plugin.deepmd.argcheck import check_save_dir

    monkeypatch.chdir(tmp_path)
    if path.startswith("/"):  # the same place, under the temporary directory
        given = given.replace("/x/", f"{tmp_path}/x/")
        path = path.replace("/x/", f"{tmp_path}/x/")
    expected = Path(path)
    assert local_storage(local_path(given)).root == Path(os.path.abspath(expected))
    assert check_save_dir(given) == expected
    expected.mkdir(parents=True)
    assert store_directory(given) == expected
    with open_manager(given, lock=False) as manager:
        assert manager.directory == Path(os.path.abspath(expected))


@pytest.mark.parametrize(
    "url",
    ["file://otherhost/x", "file:///x?y=1", "file://", "file:///x\n", "file:///x\ty"],
)
def test_a_file_url_names_a_local_path(url):
    with pytest.raises(ConfigError) as raised:
        storage_for(url)
    assert "file" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        local_path(url)
    assert "\n" not in str(raised.value)


def test_a_file_url_of_another_host_is_refused_in_one_line_everywhere(tmp_path):
    from dp_ckpt_plugin import CheckpointManager
    from dp_ckpt_plugin.commands import UsageError, is_remote
    from dp_ckpt_plugin.deepmd.argcheck import check_save_dir

    url = "file://host/x"
    line = "file://host/x: a file URL names a path of this machine (file:///path), "
    line += "with no host, query or fragment"
    with pytest.raises(ConfigError) as raised:
        local_path(url)
    assert str(raised.value) == line
    with pytest.raises(ConfigError) as raised:
        check_save_dir(url)
    assert str(raised.value) == f"`training.save_dir`: {line}"
    with pytest.raises(UsageError, match="^" + re.escape(line) + "$"):
        is_remote(url)
    with pytest.raises(ConfigError, match="^" + re.escape(line) + "$"):
        CheckpointManager(url, lock=False)
    assert list(tmp_path.iterdir()) == []


def test_memory_urls():
    storage = storage_for("memory://registry-test/run")
    assert (
        isinstance(storage, MemoryStorage)
        and storage.url == "memory://registry-test/run"
    )
    with pytest.raises(ConfigError, match="names a bucket"):
        storage_for("memory://")
    with pytest.raises(ConfigError, match="takes no options"):
        storage_for("memory://b", region="x")


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.parametrize("url", ["s3://bucket1/run", "S3://bucket1/run"])
def test_s3_urls_are_cloud_storage(s3_env, url):
    from dp_ckpt_plugin.objectstore.cloud import CloudStorage

    storage = storage_for(url, region="eu-west-1")
    assert isinstance(storage, CloudStorage)
    assert storage.url == "s3://bucket1/run" and storage.settings.region == "eu-west-1"


def test_an_unknown_scheme_is_one_line_listing_the_known_ones():
    with pytest.raises(ConfigError) as raised:
        storage_for("nosuch://bucket/run")
    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith("nosuch://bucket/run: no storage serves nosuch://")
    for scheme in ("memory://", "s3://", "gs://", "az://"):
        assert scheme in text
    assert "file://" not in text and text.endswith("or give a local path)")


class Recorded(MemoryStorage):
    """A storage made by an offered factory, remembering what it was given."""

    def __init__(self, url, **options):
        super().__init__("memory://registered/" + url.partition("://")[2])
        self.given = (url, options)


class Second(Recorded):
    """Another storage offered for the same scheme."""


class Offering:
    """A plugin offering ``storages`` through ``register_storages``."""

    def __init__(self, storages: dict) -> None:
        self.storages = storages

    @hookimpl
    def register_storages(self) -> dict:
        return self.storages


@pytest.fixture
def offer():
    """Register plugins offering storages on the process's plugin manager."""
    pm = registry.plugin_manager()
    added: list[Offering] = []

    def add(storages: dict) -> Offering:
        added.append(Offering(storages))
        pm.register(added[-1])
        return added[-1]

    yield add
    for plugin in added:
        if pm.is_registered(plugin):
            pm.unregister(plugin)


def test_a_plugin_offers_a_scheme(offer):
    plugin = offer({"test+rec": Recorded})
    storage = storage_for("test+rec://here/run", flavour="x")
    assert isinstance(storage, Recorded) and isinstance(storage, ObjectStorage)
    assert storage.given == ("test+rec://here/run", {"flavour": "x"})
    assert "test+rec" in registry.known_schemes()
    registry.plugin_manager().unregister(plugin)
    with pytest.raises(ConfigError):
        storage_for("test+rec://here/run")


def test_of_a_scheme_offered_twice_the_plugin_called_first_wins(offer):
    offer({"test+rec": Recorded})
    offer({"test+rec": Second})  # registered last, called first
    assert type(storage_for("test+rec://x")) is Second


@pytest.mark.parametrize("scheme", ["", "S3", "1fs", "a b", "x/y", None])
def test_an_offer_that_is_not_a_scheme_is_refused(offer, scheme):
    offer({scheme: Recorded})
    with pytest.raises(ConfigError, match="not a URL scheme"):
        storage_for("other://x")


def test_an_offer_that_is_not_callable_is_refused(offer):
    offer({"test+rec": "not a factory"})
    with pytest.raises(ConfigError, match="is not callable"):
        storage_for("test+rec://x")


def test_a_plugin_cannot_replace_a_built_in_scheme_nor_file(offer, tmp_path):
    offer({"gs": Recorded, "file": Recorded})
    assert registry._factory("gs") is registry.BUILTIN["gs"]
    assert "file" not in registry.known_schemes()
    with pytest.raises(ConfigError, match="a local path is a directory store"):
        storage_for(f"file://{tmp_path}")


# -- installed plugins ------------------------------------------------------------

PLUGIN = """
from doubles.memory import MemoryStorage

from dp_ckpt_plugin import hookimpl


def make(url, **options):
    \"\"\"A storage for tmpfs://bucket/prefix, kept in memory.\"\"\"
    storage = MemoryStorage("memory://" + url.partition("://")[2])
    storage.options = options
    return storage


@hookimpl
def register_storages():
    return {"tmpfs": make, "gs": make}
"""


def installed(tmp_path: Path, points: dict[str, str]) -> Path:
    """A site folder where a package declaring ``points`` looks installed."""
    site = tmp_path / "site"
    (site / "tmp_storage_plugin").mkdir(parents=True)
    (site / "tmp_storage_plugin" / "__init__.py").write_text(PLUGIN)
    (site / "broken_storage_plugin.py").write_text("raise ImportError('no such lib')\n")
    info = site / "tmp_storage_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tmp-storage-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        + "".join(f"{name} = {target}\n" for name, target in points.items())
    )
    return site


def run_child(site: Path, code: str, **env) -> dict:
    path = os.pathsep.join([str(site), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **env},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


CHILD = """
    import json, sys
    from dp_ckpt_plugin.errors import ConfigError
    from dp_ckpt_plugin.objectstore import registry

    out = {"loaded_at_start": "tmp_storage_plugin" in sys.modules}
    registry.remote_url("s3://plain/x")
    out["loaded_for_a_builtin"] = "tmp_storage_plugin" in sys.modules
    try:
        out["known"] = registry.known_schemes()
        storage = registry.storage_for("tmpfs://bucket/run", speed="fast")
        storage.put("k", b"v")
        out["made"] = [type(storage).__name__, storage.url, storage.options]
        out["read"] = registry.storage_for("tmpfs://bucket/run").get("k")[0].decode()
        out["builtin"] = registry._factory("gs") is registry.BUILTIN["gs"]
    except ConfigError as exc:
        out["made"] = str(exc)
    print(json.dumps(out))
"""


def test_a_storage_plugin_is_loaded_when_a_scheme_is_not_built_in(tmp_path):
    site = installed(tmp_path, {"tmpfs": "tmp_storage_plugin"})
    out = run_child(site, CHILD)
    assert not out["loaded_at_start"] and not out["loaded_for_a_builtin"]
    assert {"tmpfs", "s3"} <= set(out["known"])
    assert out["made"] == ["MemoryStorage", "memory://bucket/run", {"speed": "fast"}]
    assert out["read"] == "v"
    assert out["builtin"] is True  # its offer of gs:// is ignored


def test_a_plugin_that_cannot_be_loaded_is_one_line(tmp_path):
    site = installed(tmp_path, {"broken": "broken_storage_plugin"})
    out = run_child(site, CHILD)
    assert out["made"] == (
        "the plugins offering storages could not be loaded: ImportError: no such lib"
    )


def test_a_blocked_storage_plugin_is_not_loaded(tmp_path):
    site = installed(tmp_path, {"tmpfs": "tmp_storage_plugin"})
    out = run_child(site, CHILD, DP_CKPT_DISABLE_PLUGINS="tmpfs")
    assert "tmpfs" not in out["known"]
    assert out["made"].startswith("tmpfs://bucket/run: no storage serves tmpfs://")
