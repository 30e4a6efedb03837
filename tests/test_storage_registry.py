"""The registry from URL scheme to storage, and storages added by entry point.

Built-in schemes give their storage; an unknown one is one line listing the
known ones; :func:`register` adds a scheme; an installed package adds one
through the ``dp_ckpt.storage`` entry-point group (a ``.dist-info`` folder on
``sys.path`` of a child process, as ``pip install`` leaves it), loaded only
when its scheme is asked for.
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

from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.objectstore import registry
from dp_ckpt_plugin.objectstore.registry import (
    ENTRY_POINT_GROUP,
    local_path,
    register,
    scheme_of,
    storage_for,
    unregister,
)
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
    """A storage made by a registered factory, remembering what it was given."""

    def __init__(self, url, **options):
        super().__init__("memory://registered/" + url.partition("://")[2])
        self.given = (url, options)


def test_register_a_scheme():
    register("test+rec", Recorded)
    try:
        storage = storage_for("test+rec://here/run", flavour="x")
        assert isinstance(storage, Recorded) and isinstance(storage, ObjectStorage)
        assert storage.given == ("test+rec://here/run", {"flavour": "x"})
        assert "test+rec" in registry.known_schemes()
        with pytest.raises(ValueError, match="already has a storage"):
            register("test+rec", Recorded)
        register("test+rec", MemoryStorage, replace=True)
        assert type(storage_for("test+rec://x")) is MemoryStorage
    finally:
        unregister("test+rec")
    with pytest.raises(ConfigError):
        storage_for("test+rec://here/run")


@pytest.mark.parametrize("scheme", ["", "S3", "1fs", "a b", "x/y", None])
def test_register_refuses_what_is_not_a_scheme(scheme):
    with pytest.raises(ValueError, match="not a URL scheme"):
        register(scheme, Recorded)


def test_a_built_in_scheme_can_be_replaced_and_comes_back():
    register("gs", Recorded, replace=True)
    try:
        assert isinstance(storage_for("gs://b/x"), Recorded)
    finally:
        unregister("gs")
    assert registry._factory("gs") is registry.BUILTIN["gs"]


# -- entry points -----------------------------------------------------------------

PLUGIN = '''
from doubles.memory import MemoryStorage

LOADED = []


def make(url, **options):
    """A storage for tmpfs://bucket/prefix, kept in memory."""
    LOADED.append(url)
    storage = MemoryStorage("memory://" + url.partition("://")[2])
    storage.options = options
    return storage
'''


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
    from doubles.memory import serve_memory

    serve_memory()
    out = {"loaded_at_start": "tmp_storage_plugin" in sys.modules}
    storage = registry.storage_for("memory://plain/x")
    out["loaded_for_a_builtin"] = "tmp_storage_plugin" in sys.modules
    out["known"] = registry.known_schemes()
    try:
        storage = registry.storage_for("tmpfs://bucket/run", speed="fast")
        storage.put("k", b"v")
        out["made"] = [type(storage).__name__, storage.url, storage.options]
        out["read"] = registry.storage_for("memory://bucket/run").get("k")[0].decode()
    except ConfigError as exc:
        out["made"] = str(exc)
    try:
        registry.storage_for("broken://x")
    except ConfigError as exc:
        out["broken"] = str(exc)
    print(json.dumps(out))
"""


def test_a_storage_from_an_entry_point_is_loaded_when_its_scheme_is_asked(tmp_path):
    site = installed(
        tmp_path,
        {"tmpfs": "tmp_storage_plugin:make", "broken": "broken_storage_plugin:make"},
    )
    out = run_child(site, CHILD)
    assert not out["loaded_at_start"] and not out["loaded_for_a_builtin"]
    assert {"tmpfs", "broken", "s3"} <= set(out["known"])
    assert out["made"] == ["MemoryStorage", "memory://bucket/run", {"speed": "fast"}]
    assert out["read"] == "v"
    assert out["broken"] == (
        "the storage for broken:// (broken_storage_plugin:make) could not be "
        "loaded: ImportError: no such lib"
    )


def test_a_blocked_entry_point_is_not_loaded(tmp_path):
    site = installed(tmp_path, {"tmpfs": "tmp_storage_plugin:make"})
    out = run_child(site, CHILD, DP_CKPT_DISABLE_PLUGINS="tmpfs")
    assert "tmpfs" not in out["known"]
    assert out["made"].startswith("tmpfs://bucket/run: no storage serves tmpfs://")


def test_an_entry_point_does_not_replace_a_built_in_scheme(tmp_path):
    site = installed(tmp_path, {"gs": "tmp_storage_plugin:make"})
    code = """
        import json, sys
        from dp_ckpt_plugin.objectstore import registry
        builtin = registry._factory("gs") is registry.BUILTIN["gs"]
        print(json.dumps({"builtin": builtin,
                          "loaded": "tmp_storage_plugin" in sys.modules}))
    """
    out = run_child(site, code)
    assert out == {"builtin": True, "loaded": False}
