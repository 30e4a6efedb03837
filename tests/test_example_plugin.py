"""The example plugin package ``examples/backup_plugin`` (dp-ckpt-backup).

It is found through its entry point, copies every committed checkpoint with
its record, and ``--restart backup`` restores from the copy after the store is
lost. Installing is simulated without pip: a ``.dist-info`` folder carrying
the package's entry points on ``sys.path`` is what ``pip install`` leaves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import make_payload, open_manager, payload_mismatches, plugin_manager

from dp_ckpt_plugin.checkpoint.records import read_record, record_path, verify
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import RestartNotFoundError
from dp_ckpt_plugin.plugin import ENTRY_POINT_GROUP

PACKAGE = Path(__file__).resolve().parents[1] / "examples" / "backup_plugin"
PYPROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text("utf-8"))


@pytest.fixture
def backup():
    """The plugin module, imported from the example package."""
    spec = importlib.util.spec_from_file_location(
        "dp_ckpt_backup", PACKAGE / "dp_ckpt_backup" / "__init__.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backup_dir(tmp_path, monkeypatch):
    folder = tmp_path / "backups"
    monkeypatch.setenv("DP_CKPT_BACKUP_DIR", str(folder))
    return folder


def installed(tmp_path: Path) -> Path:
    """A site folder where the package looks installed (its dist-info)."""
    site = tmp_path / "site"
    info = site / "dp_ckpt_backup-0.1.0.dist-info"
    info.mkdir(parents=True)
    project = PYPROJECT["project"]
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    points = project["entry-points"][ENTRY_POINT_GROUP]
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        + "".join(f"{name} = {target}\n" for name, target in points.items())
    )
    return site


def test_the_package_is_found_through_its_entry_point(tmp_path):
    site = installed(tmp_path)
    code = (
        "from dp_ckpt_plugin import get_plugin_manager\n"
        "pm = get_plugin_manager()\n"
        "print(getattr(pm.get_plugin('backup'), '__name__', None))\n"
    )
    path = os.pathsep.join([str(site), str(PACKAGE), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dp_ckpt_backup"
    blocked = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path, "DP_CKPT_DISABLE_PLUGINS": "backup"},
    )
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout.strip() == "None"


def test_every_commit_is_copied_with_its_record(tmp_path, backup, backup_dir):
    m = open_manager(tmp_path / "models", pm=plugin_manager(backup), max_keep=2)
    with m:
        paths = [m.save(step, make_payload(step)) for step in range(1, 5)]
    copies = backup_dir / "models"
    # the store keeps 2; the backup keeps every copy, each with its record
    assert sorted(p.name for p in copies.glob("model.ckpt-*.h5")) == [
        p.name for p in paths
    ]
    for step, path in enumerate(paths, start=1):
        copy = copies / path.name
        record = read_record(copy)
        assert (record.name, record.step) == (path.name, step)
        verify(copy, record, digest=True)
    assert json.loads(record_path(copies / paths[-1].name).read_text()) == json.loads(
        record_path(paths[-1]).read_text()
    )
    assert main(["verify", str(copies), "--digest"]) == 0


def test_restart_backup_after_the_store_is_lost(tmp_path, backup, backup_dir):
    store = tmp_path / "models"
    pm = plugin_manager(backup)
    with open_manager(store, pm=pm) as m:
        for step in range(1, 4):
            m.save(step, make_payload(step))
    for path in store.iterdir():
        if path.is_file() or path.is_symlink():
            path.unlink()
    with open_manager(store, pm=plugin_manager(backup), verify="digest") as m:
        with pytest.raises(RestartNotFoundError):
            m.restore("latest")
        restored = m.restore("backup")
        assert restored.step == 3
        assert restored.path == backup_dir / "models" / "model.ckpt-3.h5"
        assert restored.resolved.checked == "digest"
        assert payload_mismatches(restored.state, 3) == []
        assert m.resolve("backup:models") == restored.path
        # other specifications are not the plugin's
        with pytest.raises(RestartNotFoundError, match="no checkpoint found"):
            m.resolve("nothing-here")


def test_a_corrupt_copy_is_not_restarted_from(tmp_path, backup, backup_dir):
    with open_manager(tmp_path / "models", pm=plugin_manager(backup)) as m:
        for step in range(1, 4):
            m.save(step, make_payload(step))
    newest = backup_dir / "models" / "model.ckpt-3.h5"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    newest.write_bytes(bytes(raw))
    with open_manager(
        tmp_path / "other", pm=plugin_manager(backup), verify="digest"
    ) as m:
        restored = m.restore("backup:models")
    assert restored.step == 2  # the flipped copy was moved aside


def test_without_a_backup_directory_the_plugin_does_nothing(
    tmp_path, backup, monkeypatch
):
    monkeypatch.delenv("DP_CKPT_BACKUP_DIR", raising=False)
    with open_manager(tmp_path / "models", pm=plugin_manager(backup)) as m:
        m.save(1, make_payload(1))
        with pytest.raises(RestartNotFoundError, match="DP_CKPT_BACKUP_DIR is not set"):
            m.resolve("backup")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


def test_a_failing_copy_never_stops_a_save(tmp_path, backup, monkeypatch, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("DP_CKPT_BACKUP_DIR", str(blocker))
    with open_manager(tmp_path / "models", pm=plugin_manager(backup)) as m:
        path = m.save(1, make_payload(1))
    assert read_record(path) is not None
    assert any("on_commit observer" in r.message for r in caplog.records)
