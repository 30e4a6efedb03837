"""Rules 1-3, 5-7 and 11-15 through a real store on real files."""

from __future__ import annotations

import json
import os
import shutil
import threading

import numpy as np
import pytest
from helpers import make_payload, make_store, payload_mismatches

from dp_ckpt_plugin import CheckpointStore
from dp_ckpt_plugin.checkpoint.digests import digest_of
from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.checkpoint.records import FORMAT_VERSION, read_record


def visible(directory):
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


def test_layout_of_numbered_ema_pointer_and_alias(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d, keep=0) as store:
        for step in (5, 10):
            assert store.save(step, make_payload(step)) == d / f"model.ckpt-{step}.h5"
            assert (
                store.save(step, make_payload(1000 + step), family="model_ema.ckpt")
                == d / f"model_ema.ckpt-{step}.h5"
            )
    assert visible(d) == [
        "checkpoint",
        "checkpoint.model_ema.ckpt",
        "model.ckpt-10.h5",
        "model.ckpt-5.h5",
        "model.ckpt.h5",
        "model_ema.ckpt-10.h5",
        "model_ema.ckpt-5.h5",
        "model_ema.ckpt.h5",
    ]
    # rule 2: everything in D, recorded relative to D
    assert (d / "checkpoint").read_text().strip() == "model.ckpt-10.h5"
    assert os.readlink(d / "model.ckpt.h5") == "model.ckpt-10.h5"
    assert os.readlink(d / "model_ema.ckpt.h5") == "model_ema.ckpt-10.h5"
    assert (
        d / "checkpoint.model_ema.ckpt"
    ).read_text().strip() == "model_ema.ckpt-10.h5"


def test_store_directory_is_relocatable(tmp_path, make_manager):
    m = make_manager(tmp_path / "run1" / "models", max_keep=0)
    for step in (1, 2, 3):
        m.save(step, make_payload(step))
    m.close()
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tmp_path / "run1" / "models", moved, symlinks=True)
    shutil.rmtree(tmp_path / "run1")
    m2 = make_manager(moved)
    r = m2.restore(str(moved))
    assert r.step == 3 and r.path == moved / "model.ckpt-3.h5"
    assert payload_mismatches(r.state, 3) == []
    assert m2.restore("latest").path == moved / "model.ckpt-3.h5"


def test_compat_pointer_and_alias_outside_the_store(tmp_path, pm):
    work = tmp_path / "work"
    work.mkdir()
    d = work / "models"
    compat = {"pointer": work / "checkpoint", "alias": work / "model.ckpt.h5"}
    with make_store(pm, d, compat=compat) as store:
        store.save(3, make_payload(3))
        store.save(4, make_payload(4))
    # rule 3: deepmd-kit's working-directory files, relative to their directory
    assert (work / "checkpoint").read_text().strip() == os.path.join(
        "models", "model.ckpt-4.h5"
    )
    assert os.readlink(work / "model.ckpt.h5") == os.path.join(
        "models", "model.ckpt-4.h5"
    )
    assert (work / "model.ckpt.h5").resolve() == d / "model.ckpt-4.h5"


def test_commit_record_fields(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d) as store:
        path = store.save(7, make_payload(7))
    record = read_record(path)
    assert (
        record.step == 7 and record.family == "model.ckpt" and record.format == "hdf5"
    )
    assert record.size == path.stat().st_size
    assert record.digest == digest_of(path)
    assert record.format_version == FORMAT_VERSION
    raw = json.loads((d / ".model.ckpt-7.h5.commit.json").read_text())
    assert set(raw) >= {"size", "digest", "step", "family", "format", "format_version"}
    assert raw["digest"].startswith("blake3:") and raw["format_version"] == 2
    # a record written before "backend" was renamed "format" still reads
    raw["backend"] = raw.pop("format")
    (d / ".model.ckpt-7.h5.commit.json").write_text(json.dumps(raw))
    assert read_record(path) == record


def test_write_sequence_is_temp_fsync_replace_dirfsync(tmp_path, pm, monkeypatch):
    """Rules 5-7: every file reaches its name by os.replace after an fsync."""
    events = []
    real_replace, real_fsync, real_symlink = os.replace, os.fsync, os.symlink

    def replace(src, dst):
        events.append(("replace", os.path.basename(src), os.path.basename(dst)))
        return real_replace(src, dst)

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(
            ("fsync", "dir" if os.path.isdir(target) else os.path.basename(target))
        )
        return real_fsync(fd)

    def symlink(src, dst, *a, **k):
        events.append(("symlink", os.path.basename(dst)))
        return real_symlink(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "symlink", symlink)
    with make_store(pm, tmp_path / "m") as store:
        store.save(1, make_payload(1))
    monkeypatch.undo()
    # the lock's holder note and the store's manifest are informative only and
    # written without fsync
    events = [
        e
        for e in events
        if not any(
            n in str(x) for x in e for n in (".dp_ckpt.holder", ".dp_ckpt.store")
        )
    ]
    finals = [e[2] for e in events if e[0] == "replace"]
    # the record (of the fsynced, hashed temporary payload), then the payload
    # gets its name, then the pointer, then the alias
    assert finals == [
        ".model.ckpt-1.h5.commit.json",
        "model.ckpt-1.h5",
        "checkpoint",
        "model.ckpt.h5",
    ]
    for i, event in enumerate(events):
        if event[0] == "replace":
            src = event[1]
            assert src.startswith(".") and ".tmp-" in src, event
            # a symlink has no data to fsync; the store's own pointer is not
            # fsynced either (an empty one is skipped for the alias); the
            # record is moved onto its name first, its bytes fsynced after,
            # before the payload is named (which no record names until then)
            if event[2] == ".model.ckpt-1.h5.commit.json":
                named = finals.index("model.ckpt-1.h5")
                before = events[i : events.index(("replace", *_move_of(events, named)))]
                assert ("fsync", event[2]) in before, "record not fsynced before"
                assert ("fsync", "dir") in before, "record's name not durable before"
            elif not src.startswith((".model.ckpt.h5", ".checkpoint")):
                assert ("fsync", src) in events[:i], f"{src} replaced before fsync"
            # the payload, pointer and alias share one directory fsync, after
            # all three moved
            if event[2] in ("model.ckpt-1.h5", "checkpoint", "model.ckpt.h5"):
                assert ("fsync", "dir") in events[i + 1 :], event
    assert (
        "symlink",
        "model.ckpt.h5",
    ) not in events  # never links the final name directly


def _move_of(events, index):
    """The (source, name) of the ``index``-th rename in ``events``."""
    moves = [e for e in events if e[0] == "replace"]
    return moves[index][1:]


def test_alias_and_pointer_never_vanish_while_publishing(tmp_path, pm):
    """Rule 7: a reader polling during many publications always sees a target."""
    d = tmp_path / "models"
    store = make_store(pm, d, keep=3)
    store.save(0, {"x": np.zeros(1)})
    stop = threading.Event()
    misses = []
    reads = [0]

    def reader():
        while not stop.is_set():
            reads[0] += 1
            if not os.path.exists(d / "model.ckpt.h5"):
                misses.append("alias")
            try:
                if not (d / "checkpoint").read_text().strip():
                    misses.append("empty pointer")
            except FileNotFoundError:
                misses.append("pointer")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for step in range(1, 80):
            store.save(step, {"x": np.full(1, step)})
    finally:
        stop.set()
        thread.join()
        store.close()
    assert reads[0] > 100
    assert misses == []


def test_uncommitted_numbered_file_is_not_latest(tmp_path, make_manager):
    """Rule 6: a payload without a commit record does not count."""
    m = make_manager(max_keep=0)
    m.save(1, make_payload(1))
    # a torn write of step 2 that never got its record (and a stale pointer)
    shutil.copy(m.directory / "model.ckpt-1.h5", m.directory / "model.ckpt-2.h5")
    with open(m.directory / "model.ckpt-2.h5", "r+b") as fh:
        fh.truncate(100)
    (m.directory / "checkpoint").unlink()
    (m.directory / "model.ckpt.h5").unlink()
    assert m.restore(str(m.directory)).step == 1


def test_window_and_values_below_one(tmp_path, make_manager):
    m = make_manager(tmp_path / "a", max_keep=2)
    for step in range(6):
        m.save(step, make_payload(step))
    assert visible(m.directory) == [
        "checkpoint",
        "model.ckpt-4.h5",
        "model.ckpt-5.h5",
        "model.ckpt.h5",
    ]
    # the last prune's record goes at the next save or at close (it waits for
    # an fsync of the directory after its payload's removal); until then it
    # names no file and nothing counts it
    assert (m.directory / ".model.ckpt-3.h5.commit.json").is_file()
    assert [c.step for c in m.store.committed()] == [4, 5]
    m.close()
    assert sorted(n for n in os.listdir(m.directory) if n.endswith(".commit.json")) == [
        ".model.ckpt-4.h5.commit.json",
        ".model.ckpt-5.h5.commit.json",
    ]
    keep_all = make_manager(tmp_path / "b", max_keep=0)
    for step in range(6):
        keep_all.save(step, make_payload(step))
    assert (
        len([n for n in os.listdir(keep_all.directory) if n.startswith("model.ckpt-")])
        == 6
    )


def test_ema_family_has_its_own_window(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d, keep=1, ema_keep=3) as store:
        for step in range(5):
            store.save(step, make_payload(step))
            store.save(step, make_payload(step), family="model_ema.ckpt")
    assert [n for n in visible(d) if n.startswith("model.ckpt-")] == ["model.ckpt-4.h5"]
    assert [n for n in visible(d) if n.startswith("model_ema.ckpt-")] == [
        "model_ema.ckpt-2.h5",
        "model_ema.ckpt-3.h5",
        "model_ema.ckpt-4.h5",
    ]


def test_resumed_from_is_protected_until_a_later_step_is_committed(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d, keep=0) as store:
        for step in (10, 20, 30):
            store.save(step, make_payload(step))
    with make_store(pm, d, keep=1) as store:
        found = store.resolve(str(d / "model.ckpt-20.h5"))
        assert found.step == 20
        # a re-run from 20 that first saves step 15 (for example an
        # init-model that restarts the count) must not delete its origin,
        # and the family holds max(window, protected) = 2 files
        store.save(15, make_payload(15))
        assert [n for n in visible(d) if n.startswith("model.ckpt-")] == [
            "model.ckpt-15.h5",
            "model.ckpt-20.h5",
        ]
        store.save(25, make_payload(25))
        assert [n for n in visible(d) if n.startswith("model.ckpt-")] == [
            "model.ckpt-25.h5"
        ]


def test_remnants_above_the_resumed_step_are_archived_at_the_first_commit(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d, keep=0) as store:
        for step in (1, 2, 3, 4):
            store.save(step, make_payload(step))
    old3 = (d / "model.ckpt-3.h5").read_bytes()
    with make_store(pm, d, keep=0) as store:
        store.resolve(str(d / "model.ckpt-2.h5"))
        assert "model.ckpt-4.h5" in visible(d)  # nothing moved before a commit
        store.save(3, make_payload(33))
        assert [n for n in visible(d) if n.startswith("model.ckpt-")] == [
            "model.ckpt-1.h5",
            "model.ckpt-2.h5",
            "model.ckpt-3.h5",
        ]
    # the abandoned branch (3 and 4 of the earlier run) is archived, not deleted
    (archived,) = (d / "archive").iterdir()
    assert sorted(p.name for p in archived.glob("model.ckpt-*.h5")) == [
        "model.ckpt-3.h5",
        "model.ckpt-4.h5",
    ]
    assert (archived / "model.ckpt-3.h5").read_bytes() == old3
    assert (
        payload_mismatches(
            make_store(pm, d).load(make_store(pm, d).resolve("latest")), 33
        )
        == []
    )


def test_files_that_are_not_numbered_checkpoints_are_never_touched(tmp_path, pm):
    d = tmp_path / "models"
    d.mkdir()
    others = [
        "model.ckpt-best.h5",  # best-validation style name
        "notes.txt",
        "other.ckpt-1.h5",  # another family
        "model.ckpt-007.h5",  # zero-padded
        "model.ckpt-0.pt",  # another suffix
        "model.ckpt-1.h5",  # numbered but uncommitted (plain deepmd-kit)
    ]
    for name in others:
        (d / name).write_bytes(b"user data " + name.encode())
    with make_store(pm, d, keep=1) as store:
        for step in range(2, 8):
            store.save(step, make_payload(step))
    for name in others:
        assert (d / name).read_bytes() == b"user data " + name.encode()
    fam = Family("model.ckpt", ".h5")
    assert [n for n in visible(d) if fam.step_of(n) is not None] == [
        "model.ckpt-1.h5",
        "model.ckpt-7.h5",
    ]


def test_resave_of_the_same_step_replaces_it_committed(tmp_path, make_manager):
    m = make_manager(max_keep=0)
    m.save(5, make_payload(5))
    m.save(5, make_payload(55))  # e.g. the re-save after change_bias_after_training
    r = m.restore("latest")
    assert payload_mismatches(r.state, 55) == []
    assert read_record(r.path).digest == digest_of(r.path)


def test_observers_see_publication_before_pruning(tmp_path, pm):
    """Rule 13: prune runs last, after publish and any observer."""
    from dp_ckpt_plugin import hookimpl

    seen = []

    class Observer:
        @hookimpl
        def on_commit(self, commit, checkpoint):
            pointer = (commit.directory / "checkpoint").read_text().strip()
            old = sorted(
                n for n in visible(commit.directory) if n.startswith("model.ckpt-")
            )
            seen.append((checkpoint.step, pointer, old))

    pm.register(Observer())
    with make_store(pm, tmp_path / "m", keep=1) as store:
        store.save(1, make_payload(1))
        store.save(2, make_payload(2))
    assert seen[1] == (2, "model.ckpt-2.h5", ["model.ckpt-1.h5", "model.ckpt-2.h5"])
    assert visible(tmp_path / "m").count("model.ckpt-1.h5") == 0


def test_non_chief_rank_writes_nothing_and_returns_the_same_path(tmp_path, pm):
    class Rank1:
        rank = 1

        def broadcast(self, value):
            raise AssertionError("not used by save")

    d = tmp_path / "models"
    store = CheckpointStore(d, format="hdf5", pm=pm, ranks=Rank1())
    assert store.save(3, make_payload(3)) == d / "model.ckpt-3.h5"
    assert not d.exists()


@pytest.mark.parametrize("bad", [-1])
def test_negative_step_is_refused(tmp_path, make_manager, bad):
    with pytest.raises(ValueError, match="negative"):
        make_manager().save(bad, make_payload(1))


def test_open_sweeps_temporaries_and_orphan_records_only(tmp_path, pm):
    d = tmp_path / "models"
    with make_store(pm, d, keep=0) as store:
        store.save(1, make_payload(1))
    leftovers = [
        ".model.ckpt-2.h5.tmp-123-0123abcd",  # a killed payload write
        ".checkpoint.tmp-123-0123abcd",  # a killed pointer update
        ".model.ckpt-9.h5.commit.json",  # a kill between the unlinks of a prune
    ]
    kept = [
        ".model.ckpt-1.h5.commit.json",
        ".hidden-user-file",
        "notes.txt",
        ".notes.txt.tmp-123-0123abcd",  # exactly our pattern, but not our file
        ".model.ckpt-2.h5.tmp-123-abcd",  # not exactly our pattern
    ]
    for name in leftovers + kept[1:]:
        (d / name).write_text("x")
    with make_store(pm, d, keep=0) as store:
        store.resolve("latest")  # continues the run: nothing is archived
        store.save(2, make_payload(2))
    names = set(os.listdir(d))
    assert not names & set(leftovers)
    assert set(kept) <= names


def test_save_dir_equal_to_the_working_directory(tmp_path, pm):
    """With ``save_dir: "."`` the compat pointer and alias are the store's own."""
    compat = {"pointer": tmp_path / "checkpoint", "alias": tmp_path / "model.ckpt.h5"}
    with make_store(pm, tmp_path, keep=1, compat=compat) as store:
        store.save(1, make_payload(1))
        store.save(2, make_payload(2))
    assert (
        tmp_path / "checkpoint"
    ).read_text() == "model.ckpt-2.h5"  # deepmd-kit reads it unstripped
    assert os.readlink(tmp_path / "model.ckpt.h5") == "model.ckpt-2.h5"
    assert [n for n in visible(tmp_path) if n.startswith("model.ckpt-")] == [
        "model.ckpt-2.h5"
    ]
