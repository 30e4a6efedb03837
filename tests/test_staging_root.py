"""The staging root is private: every level checked on every start.

The walk plants each defect (a link, another user's folder, a mode the group
or others may use, a file) at each level from the root to a staging
directory and checks that the start is refused in one line naming that
level, and that nothing was made through it.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

import pytest
from doubles.memory import MemoryStorage, forget

from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.storage import staging
from dp_ckpt_plugin.storage.staging import STAGING_ENV, staging_dir, staging_path

URL = "s3://bucket/run"
OTHER_UID = 12345
LEVELS = ("root", "purpose", "store")
DEFECTS = (
    "link",
    "other owner",
    "mode 0750",
    "mode 0705",
    "mode 0770",
    "mode 0755",
    "mode 0777",
    "mode 0701",
    "file",
)


def _levels(root: Path) -> dict[str, Path]:
    path = staging_path(URL, base=root)
    return {"root": root, "purpose": path.parent, "store": path}


def _plant(where: Path, defect: str, decoy: Path) -> None:
    """Put ``defect`` at ``where`` (its parent exists; it does not)."""
    if defect == "link":
        decoy.mkdir(mode=0o700)
        where.symlink_to(decoy)
    elif defect == "file":
        where.write_bytes(b"")
    else:
        where.mkdir(mode=0o700)
        if defect == "other owner":
            os.chown(where, OTHER_UID, OTHER_UID)
        else:
            os.chmod(where, int(defect.split()[1], 8))


def _needs_root_for(defect: str) -> None:
    if defect == "other owner" and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")


@pytest.mark.parametrize("defect", DEFECTS)
@pytest.mark.parametrize("level", LEVELS)
def test_every_level_with_every_defect_is_refused_in_one_line(tmp_path, level, defect):
    _needs_root_for(defect)
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    root = base / "stage"
    levels = _levels(root)
    # the levels above the one with the defect are sound
    for name in LEVELS[: LEVELS.index(level)]:
        levels[name].mkdir(mode=0o700)
    decoy = tmp_path / "decoy"
    _plant(levels[level], defect, decoy)
    with pytest.raises(ConfigError) as caught:
        staging_dir(URL, base=root)
    message = str(caught.value)
    assert "\n" not in message
    assert str(levels[level]) in message
    assert STAGING_ENV in message
    # nothing was made through a link, nor below the refused level
    if defect == "link":
        assert list(decoy.iterdir()) == []
    for name in LEVELS[LEVELS.index(level) + 1 :]:
        assert not os.path.lexists(levels[name])


def test_a_sound_root_is_made_private_and_passes_again(tmp_path):
    root = tmp_path / "a" / "b" / "stage"
    path = staging_dir(URL, base=root)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", *_levels(root).values()):
        found = os.lstat(folder)
        assert stat.S_ISDIR(found.st_mode)
        assert stat.S_IMODE(found.st_mode) & 0o077 == 0, folder
        assert found.st_uid == os.geteuid()
    assert staging_dir(URL, base=root) == path  # every start checks again
    assert path == staging_path(URL, base=root)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_folder_above_the_root_others_may_write_needs_the_sticky_bit(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    root = shared / "stage"
    if mode & stat.S_ISVTX:
        assert staging_dir(URL, base=root).is_dir()
        return
    with pytest.raises(ConfigError, match=f"staging folder {shared} may be written"):
        staging_dir(URL, base=root)
    assert not root.exists()


def test_a_folder_above_the_root_of_another_user_is_refused(tmp_path):
    _needs_root_for("other owner")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=f"staging folder {theirs} belongs to user"):
        staging_dir(URL, base=theirs / "stage")


def test_the_default_root_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(STAGING_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    default = staging.staging_root()
    assert default == tmp_path / f"dp_ckpt-{os.geteuid()}"
    # another user made the folder of the computed name first: refused
    _plant(default, "link", tmp_path / "planted")
    with pytest.raises(ConfigError, match=f"staging folder {default} is a link"):
        staging_dir(URL)
    chosen = tmp_path / "chosen"
    monkeypatch.setenv(STAGING_ENV, str(chosen))
    assert staging_dir(URL).parent.parent == chosen
    assert stat.S_IMODE(os.lstat(chosen).st_mode) == 0o700


def test_every_front_refuses_a_root_that_is_not_private(tmp_path):
    """The manager and the settings of ``dp train`` check the root before use."""
    from helpers import plugin_manager

    from dp_ckpt_plugin import CheckpointManager
    from dp_ckpt_plugin.deepmd.settings import read_settings

    bucket = f"b{secrets.token_hex(4)}"
    mem = MemoryStorage(f"memory://{bucket}/run")
    root = tmp_path / "stage"
    root.mkdir(mode=0o755)
    try:
        with pytest.raises(ConfigError, match=f"staging folder {root} has mode 0755"):
            CheckpointManager(mem.url, staging=root, pm=plugin_manager())
        config = {
            "training": {
                "save_dir": "s3://bucket/run",
                "_dp_ckpt": {"remote": {"staging_dir": str(root)}},
            }
        }
        with pytest.raises(ConfigError, match=f"staging folder {root} has mode 0755"):
            read_settings(config, suffix=".pt")
    finally:
        forget(bucket)
