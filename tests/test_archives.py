"""Archives of earlier runs are managed: listed with their sizes, pruned by count
or age under the store's lock, capped at the start of a run (``max_archives``).

Rule 14 moves an earlier run into ``D/archive/<UTC>/`` instead of deleting
it; these tests cover what happens to those folders afterwards, through the
storage layer (``archive.py``), the ``dp-ckpt`` command and a store built
with ``max_archives``.
"""

from __future__ import annotations

import calendar
import json
import os
import time

import pytest
from helpers import make_payload, open_manager

from dp_ckpt_plugin import CheckpointStore
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.storage import local_storage
from dp_ckpt_plugin.store.archive import (
    archive_folders,
    archives_beyond,
    prune_archives,
    remove_archive,
)
from dp_ckpt_plugin.store.lock import StoreLock

STAMPS = ["20260101T000000Z", "20260201T000000Z", "20260201T000000Z-1"]


def runs(directory, count=3, steps=(1, 2)):
    """``count`` runs of the API into ``directory``; each new one archives the last."""
    for run in range(count):
        m = open_manager(directory, max_keep=0)
        for step in steps:
            m.save(step, make_payload(100 * run + step))
        m.close()
    return archive_folders(directory, storage=local_storage(directory))


def named(directory, stamps=STAMPS):
    """Archives of known names (times) with two checkpoints each."""
    for stamp in stamps:
        folder = directory / "archive" / stamp
        folder.mkdir(parents=True)
        for step in (1, 2):
            (folder / f"model.ckpt-{step}.h5").write_bytes(b"x" * 100)
            (folder / f".model.ckpt-{step}.h5.commit.json").write_text("{}")
        (folder / "checkpoint").write_text("model.ckpt-2.h5")
        (folder / "model.ckpt.h5").symlink_to("model.ckpt-2.h5")
    return archive_folders(directory, storage=local_storage(directory))


def test_archive_folders_say_what_each_holds_and_its_size(tmp_path):
    d = tmp_path / "models"
    folders = runs(d)
    assert len(folders) == 2
    for folder in folders:
        assert folder.checkpoints == ["model.ckpt-1.h5", "model.ckpt-2.h5"]
        on_disk = sum(
            p.lstat().st_size for p in folder.path.iterdir() if not p.is_symlink()
        )
        assert folder.size == on_disk
    assert folders[0].created <= folders[1].created


def test_folder_times_come_from_their_names_oldest_first(tmp_path):
    folders = named(tmp_path)
    assert [f.name for f in folders] == STAMPS
    assert folders[0].created == calendar.timegm((2026, 1, 1, 0, 0, 0))
    assert folders[0].size == 2 * (100 + 2) + len("model.ckpt-2.h5")


def test_no_archive_folder_is_an_empty_list(tmp_path):
    assert archive_folders(tmp_path, storage=local_storage(tmp_path)) == []
    (tmp_path / "archive").symlink_to(tmp_path)  # never followed
    assert archive_folders(tmp_path, storage=local_storage(tmp_path)) == []


@pytest.mark.parametrize(
    ("keep", "days", "gone"),
    [
        (None, None, []),
        (3, None, []),
        (2, None, [0]),
        (0, None, [0, 1, 2]),
        (None, 40, [0]),  # made more than 40 days before 2026-03-01
        (None, 10, [0, 1, 2]),
        (2, 40, [0]),
        (3, 10, [0, 1, 2]),  # either says so
        (1, 40, [0, 1]),
    ],
)
def test_a_count_or_an_age_removes_the_oldest(tmp_path, keep, days, gone):
    folders = named(tmp_path)
    now = calendar.timegm((2026, 3, 1, 0, 0, 0))
    doomed = archives_beyond(folders, keep_last=keep, older_than_days=days, now=now)
    assert doomed == [folders[i] for i in gone]


def test_removing_an_archive_takes_links_not_their_targets(tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    folders = named(tmp_path / "models", STAMPS[:1])
    (folders[0].path / "planted").symlink_to(outside)
    storage = local_storage(tmp_path / "models")
    assert remove_archive(folders[0], storage=storage)
    assert not folders[0].path.exists()
    assert outside.read_text() == "keep me"


def test_an_archive_holding_something_else_is_left(tmp_path):
    (folder,) = named(tmp_path / "models", STAMPS[:1])
    (folder.path / "mine").mkdir()
    assert not remove_archive(folder, storage=local_storage(tmp_path / "models"))
    assert sorted(p.name for p in folder.path.iterdir()) == ["mine"]


def test_the_folder_a_run_starts_from_is_spared(tmp_path):
    d = tmp_path / "models"
    folders = named(d)
    storage = local_storage(d)
    removed = prune_archives(d, 0, storage, spare=[folders[0].path])
    assert removed == folders[1:]
    assert [f.name for f in archive_folders(d, storage=storage)] == [STAMPS[0]]


@pytest.mark.parametrize("cap", [0, 1, 2, None])
def test_a_store_with_max_archives_caps_them_at_its_first_save(tmp_path, pm, cap):
    d = tmp_path / "models"
    runs(d, count=3)  # two archives
    store = CheckpointStore(d, format="hdf5", pm=pm, max_archives=cap)
    with store:
        store.save(1, make_payload(1))  # archives the third run: three now
        left = archive_folders(d, storage=store.storage)
    assert len(left) == (3 if cap is None else cap)


def test_a_run_resumed_from_an_archive_keeps_that_archive(tmp_path, pm):
    d = tmp_path / "models"
    folders = runs(d, count=3)
    oldest = folders[0].path / "model.ckpt-2.h5"
    with CheckpointStore(d, format="hdf5", pm=pm, max_archives=0) as store:
        assert store.resolve(str(oldest)).path == oldest
        store.save(1, make_payload(1))
        left = [f.name for f in archive_folders(d, storage=store.storage)]
    assert left == [folders[0].name]


# -- the command ------------------------------------------------------------------------


def dp_ckpt(capsys, *args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def test_ls_shows_each_archive_with_its_size_and_the_total(tmp_path, capsys):
    d = tmp_path / "models"
    folders = runs(d)
    status, out, _ = dp_ckpt(capsys, "ls", d)
    assert status == 0
    total = sum(f.size for f in folders)
    assert "archive/: 2 earlier run(s), 4 checkpoint(s)," in out
    assert f"{total / 1000:.1f} kB in all" in out
    for f in folders:
        (row,) = [line for line in out.splitlines() if line.split()[:1] == [f.name]]
        assert f"{f.size / 1000:.1f} kB" in row
    _, out, _ = dp_ckpt(capsys, "ls", d, "--json")
    data = json.loads(out)
    assert data["archive_size"] == total
    assert [a["size"] for a in data["archive"]] == [f.size for f in folders]


@pytest.mark.parametrize("dry", [True, False])
def test_prune_archives_by_count(tmp_path, capsys, dry):
    d = tmp_path / "models"
    folders = named(d)
    args = ["prune", d, "--archives", "--keep-archives", "1", "--json"]
    status, out, _ = dp_ckpt(capsys, *args, *(["--dry-run"] if dry else []))
    data = json.loads(out)
    assert status == 0
    assert data["archives"]["removed"] == STAMPS[:2]
    assert data["archives"]["kept"] == STAMPS[2:]
    assert data["freed"] == folders[0].size + folders[1].size
    left = sorted(os.listdir(d / "archive"))
    assert left == (STAMPS if dry else STAMPS[2:])


def test_prune_archives_by_age_and_text(tmp_path, capsys):
    d = tmp_path / "models"
    named(d, ["20200101T000000Z", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())])
    status, out, _ = dp_ckpt(capsys, "prune", d, "--archives", "--older-than", "30")
    assert status == 0
    assert "removed 1 archive(s)" in out
    assert "20200101T000000Z" in out and "removed" in out
    assert len(os.listdir(d / "archive")) == 1


def test_prune_archives_is_refused_while_a_run_holds_the_store(tmp_path, capsys):
    d = tmp_path / "models"
    named(d)
    with StoreLock(d):
        status, _, err = dp_ckpt(
            capsys, "prune", d, "--archives", "--keep-archives", "0"
        )
    assert status == 1 and f"pid {os.getpid()}" in err
    assert sorted(os.listdir(d / "archive")) == STAMPS


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "argument --keep-archives: expected an integer, got 'abc'"),
        ("1.5", "argument --keep-archives: expected an integer, got '1.5'"),
        ("none", "argument --keep-archives: expected a count (0 or more), got 'none'"),
        ("-1", "argument --keep-archives: expected a count (0 or more), got '-1'"),
    ],
)
def test_keep_archives_refusals_say_what_they_said(tmp_path, capsys, value, message):
    d = tmp_path / "models"
    named(d)
    status, _, err = dp_ckpt(capsys, "prune", d, "--archives", "--keep-archives", value)
    assert status == 2 and message in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(d / "archive")) == STAMPS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--archives"], "needs --keep-archives N or --older-than DAYS"),
        (["--keep-archives", "1"], "go with --archives"),
        (["--archives", "--keep-archives", "-1"], "expected a count"),
        (["--archives", "--older-than", "soon"], "expected days"),
        (["--archives", "--keep-archives", "1", "--keep-last", "2"], "archives only"),
    ],
)
def test_prune_archive_mistakes_are_one_line(tmp_path, capsys, args, message):
    d = tmp_path / "models"
    named(d)
    status, _, err = dp_ckpt(capsys, "prune", d, *args)
    assert status == 2 and message in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(d / "archive")) == STAMPS
