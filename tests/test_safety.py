"""Never lose or misread a checkpoint: rules 12-15, 19, 20 and 24, by generated cases.

- Archive instead of delete: every way a run can start on a directory holding
  an earlier run, with and without an EMA family; no committed byte of the
  earlier run is ever lost.
- The sweep removes only the store's own leftovers, over every kind of name a
  store directory can meet (``save_dir: "."`` included).
- Records are evidence, parsed strictly: every malformation means "not
  committed", and the file is skipped, never moved.
- Pointers and aliases never lead the plugin astray, and its own mirrors
  always resolve.
- Threads share one store; a step is an int.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    assert_same,
    fill_store,
    make_payload,
    make_store,
    open_manager,
    plugin_manager,
)

from dp_ckpt_plugin import (
    CheckpointWriteError,
    Family,
    Hooks,
    ResolveContext,
    RestartNotFoundError,
    resolve,
    resolve_restart,
)
from dp_ckpt_plugin.checkpoint.catalogue import committed
from dp_ckpt_plugin.checkpoint.digests import digest_of
from dp_ckpt_plugin.checkpoint.layout import HOLDER_NAME, LOCK_NAME, record_name
from dp_ckpt_plugin.checkpoint.records import read_record
from dp_ckpt_plugin.storage import local_storage
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.storage.temp import temp_name

FAM = Family("model.ckpt", ".h5")
EMA = Family("model_ema.ckpt", ".h5", "checkpoint.model_ema.ckpt")


def inventory(directory: Path) -> dict[str, str]:
    """The digest of every committed checkpoint under ``directory``, archives included."""
    found = {}
    for folder in [directory, *sorted((directory / "archive").glob("*"))]:
        for fam in (FAM, EMA):
            for c in committed(folder, fam):
                found[f"{folder.name}/{c.name}"] = digest_of(c.path)
    return found


def earlier_run(directory: Path, steps, *, ema: bool) -> dict[str, str]:
    """Write an earlier run into ``directory``; return digests by file name."""
    pm = plugin_manager()
    with make_store(pm, directory, keep=0) as store:
        for step in steps:
            store.save(step, make_payload(step))
            if ema:
                store.save(step, make_payload(step + 1000), family=EMA.prefix)
    return {
        c.name: digest_of(c.path)
        for fam in (FAM, EMA)
        for c in committed(directory, fam)
    }


STARTS = ["fresh", "continue-latest", "continue-older", "init-inside", "from-elsewhere"]


@pytest.mark.parametrize("ema", [False, True], ids=["periodic", "with-ema"])
@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("keep", [0, 1, 3])
def test_a_new_run_never_loses_an_earlier_run(tmp_path, start, ema, keep, caplog):
    d = tmp_path / "models"
    before = earlier_run(d, [1, 2, 3, 4, 5], ema=ema)
    elsewhere = tmp_path / "other"
    fill_store(elsewhere, [9])
    pm = plugin_manager()
    store = make_store(pm, d, keep=keep)
    first = 1
    if start == "continue-latest":
        found = store.resolve("latest")
        first = found.step + 1
    elif start == "continue-older":
        found = store.resolve(str(d / "model.ckpt-3.h5"))
        first = 4
    elif start == "init-inside":
        found = resolve("latest", store.context())
        store.protect_resumed(found.path, continues=False)
    elif start == "from-elsewhere":
        store.resolve(str(elsewhere))
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"), store:
        for step in range(first, first + 3):
            store.save(step, make_payload(100 + step))
            if ema:
                store.save(step, make_payload(200 + step), family=EMA.prefix)
    after = inventory(d)
    # every committed checkpoint of the earlier run still exists, byte for byte,
    # in D or in an archive, unless this run's own window removed it
    archived = {
        k.split("/", 1)[1]: v for k, v in after.items() if not k.startswith("models/")
    }
    for name, digest in before.items():
        if name in archived:
            assert archived[name] == digest, name
            continue
        step = FAM.step_of(name) if FAM.step_of(name) is not None else EMA.step_of(name)
        kept_in_place = start.startswith("continue") and step < first
        assert kept_in_place, f"{name} of the earlier run was overwritten or deleted"
    archives = sorted((d / "archive").glob("*"))
    if start in ("fresh", "init-inside", "from-elsewhere"):
        assert len(archives) == 1
        assert sorted(p.name for p in archives[0].glob("model.ckpt-*.h5")) == [
            f"model.ckpt-{s}.h5" for s in (1, 2, 3, 4, 5)
        ]
        # the archive is a store of its own: its pointer and alias came along
        assert resolve(str(archives[0]), ResolveContext(FAM)).step == 5
        lines = [r.getMessage() for r in caplog.records if "archived" in r.getMessage()]
        assert len(lines) == 1 and str(archives[0]) in lines[0], lines
    elif start == "continue-older":
        assert sorted(p.name for p in archives[0].glob("model.ckpt-*.h5")) == [
            "model.ckpt-4.h5",
            "model.ckpt-5.h5",
        ]
    else:
        assert archives == []
    # the new run's checkpoints are committed and the pointer names the last
    assert (d / "checkpoint").read_text().strip() == f"model.ckpt-{first + 2}.h5"


def test_init_model_latest_follows_the_move(tmp_path):
    d = tmp_path / "models"
    earlier_run(d, [10], ema=False)
    pm = plugin_manager()
    with make_store(pm, d, keep=1) as store:
        found = resolve("latest", store.context())
        store.protect_resumed(found.path, continues=False)
        state = store.load(found)
        store.save(10, make_payload(7))  # the new run's own step 10
        moved = next((d / "archive").glob("*")) / "model.ckpt-10.h5"
        # the checkpoint the run started from is intact in the archive
        assert moved.is_file() and read_record(moved).digest == digest_of(moved)
        restored = open_manager(d / "x", max_keep=0).store.load(
            resolve(str(moved), ResolveContext(FAM))
        )
        assert_same(restored, state)


# -- the sweep ------------------------------------------------------------------

OURS = [
    temp_name("model.ckpt-3.h5"),
    temp_name("model_ema.ckpt-3.h5"),
    temp_name(record_name("model.ckpt-3.h5")),
    temp_name("checkpoint"),
    temp_name("model.ckpt.h5"),
    temp_name(HOLDER_NAME),
    record_name("model.ckpt-9.h5"),  # orphan record of the family
]
NOT_OURS = [
    ".bashrc",
    ".model.ckpt-3.h5.tmp-12-notahex1",
    ".model.ckpt-3.h5.tmp-12-0123abcd.bak",
    ".model.ckpt-3.h5.tmp-abc-0123abcd",
    ".notes.txt.tmp-12-0123abcd",  # a user's temporary of a user file
    temp_name("best.ckpt-3.t-1.pt"),
    record_name("other.ckpt-9.h5"),  # orphan record of another family
    record_name("model.ckpt-09.h5"),  # not a canonical step: not a name we write
    "model.ckpt-7.h5",  # a numbered file without a record
    ".hidden",
    "notes.txt",
]


@pytest.mark.parametrize("save_dir_is_cwd", [False, True], ids=["models", "dot"])
def test_sweep_removes_exactly_the_stores_own_leftovers(tmp_path, save_dir_is_cwd):
    d = tmp_path if save_dir_is_cwd else tmp_path / "models"
    pm = plugin_manager()
    with make_store(pm, d, keep=0) as store:
        store.save(1, make_payload(1))
    for name in OURS + NOT_OURS:
        (d / name).write_text("x")
    with make_store(pm, d, keep=0) as store:
        store.resolve("latest")  # continue: nothing to archive
        store.save(2, make_payload(2))
    names = set(os.listdir(d))
    assert not names & set(OURS), names & set(OURS)
    assert set(NOT_OURS) <= names, set(NOT_OURS) - names


def test_a_family_whose_prefix_looks_temporary_keeps_its_records(tmp_path):
    prefix = "run.tmp-1-0123abcd"
    fill_store(tmp_path / "m", [1, 2], prefix=prefix)
    with open_manager(tmp_path / "m", prefix=prefix, max_keep=0) as m:
        m.restore("latest")
        m.save(3, make_payload(3))
        assert [c.step for c in m.store.committed()] == [1, 2, 3]


def test_quarantine_never_overwrites(tmp_path):
    from dp_ckpt_plugin.resolution.quarantine import quarantine

    d = tmp_path / "m"
    fill_store(d, [1])
    first = quarantine(d / "model.ckpt-1.h5", d, storage=local_storage(d))
    fill_store(tmp_path / "n", [1])
    os.replace(tmp_path / "n" / "model.ckpt-1.h5", d / "model.ckpt-1.h5")
    second = quarantine(d / "model.ckpt-1.h5", d, storage=local_storage(d))
    assert first != second and first.is_file() and second.is_file()


# -- records are evidence ---------------------------------------------------------


def malformations():
    yield "size-as-text", lambda r: {**r, "size": str(r["size"])}
    yield "size-negative", lambda r: {**r, "size": -1}
    yield "size-bool", lambda r: {**r, "size": True}
    yield "step-float", lambda r: {**r, "step": float(r["step"])}
    yield "step-other", lambda r: {**r, "step": r["step"] - 1}
    yield "family-other", lambda r: {**r, "family": "other.ckpt"}
    yield "name-other", lambda r: {**r, "name": "model.ckpt-1.h5"}
    yield "digest-short", lambda r: {**r, "digest": r["digest"][:20]}
    yield "digest-upper", lambda r: {**r, "digest": r["digest"].upper()}
    yield "digest-no-algorithm", lambda r: {**r, "digest": r["digest"].split(":")[1]}
    yield "digest-unknown-algorithm", lambda r: {**r, "digest": "md5:" + "0" * 32}
    yield "v1-without-sha256", lambda r: {**r, "format_version": 1}
    yield "newer-version", lambda r: {**r, "format_version": 99}
    yield "no-format", lambda r: {k: v for k, v in r.items() if k != "format"}
    yield "created-text", lambda r: {**r, "created": "yesterday"}
    yield "a-list", lambda r: [r]
    yield "not-json", None


@pytest.mark.parametrize(
    ("what", "damage"),
    list(malformations()),
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_a_malformed_record_means_not_committed_never_quarantined(
    tmp_path, what, damage
):
    d = tmp_path / "models"
    fill_store(d, [1, 2, 3])
    rec = d / record_name("model.ckpt-3.h5")
    raw = json.loads(rec.read_text())
    rec.write_text("{not json" if damage is None else json.dumps(damage(raw)))
    payload = (d / "model.ckpt-3.h5").read_bytes()
    with open_manager(d, max_keep=0) as m:
        found = m.store.resolve("latest")
        assert found.step == 2
        assert any(
            "not committed" in w and "model.ckpt-3.h5" in w for w in found.warnings
        )
    assert (d / "model.ckpt-3.h5").read_bytes() == payload
    assert not (d / "quarantine").exists()
    # named explicitly, the file is refused with the reason, and left alone
    with pytest.raises(RestartNotFoundError, match="not a committed checkpoint"):
        resolve(str(d / "model.ckpt-3.h5"), ResolveContext(FAM))
    assert (d / "model.ckpt-3.h5").read_bytes() == payload


@pytest.mark.parametrize(
    "target",
    [
        "checkpoint",
        LOCK_NAME,
        HOLDER_NAME,
        record_name("model.ckpt-2.h5"),
        "sub",
        "model.ckpt.h5",
    ],
)
def test_a_pointer_naming_no_numbered_checkpoint_is_reported_and_skipped(
    tmp_path, target
):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    (d / "sub").mkdir()
    (d / LOCK_NAME).write_text("")
    (d / HOLDER_NAME).write_text("{}")
    (d / "checkpoint").write_text(target + "\n")
    found = resolve(str(d), ResolveContext(FAM))
    assert found.step == 2  # the alias, then the newest committed, answer
    assert any("pointer" in w and target in w for w in found.warnings), found.warnings


# -- the plugin's own links always resolve ------------------------------------------


def mirrored_store(tmp_path, store_dir: Path, prefix_dir: Path):
    pm = plugin_manager()
    compat = {"pointer": tmp_path / "checkpoint", "alias": prefix_dir / "model.ckpt.h5"}
    prefix_dir.mkdir(parents=True, exist_ok=True)
    with make_store(pm, store_dir, keep=0, compat=compat) as store:
        store.save(1, make_payload(1))
        store.save(2, make_payload(2))


@pytest.mark.parametrize("where", ["beside", "absolute-elsewhere"])
def test_own_mirrors_resolve_wherever_the_store_and_prefix_lie(tmp_path, where):
    work = tmp_path / "work"
    work.mkdir()
    store_dir = (
        work / "models" if where == "beside" else tmp_path / "scratch" / "models"
    )
    mirrored_store(work, store_dir, work / "ckpt")
    ctx = ResolveContext(FAM, cwd=work)
    # the prefix with its own directory (save_ckpt: "ckpt/model.ckpt")
    assert resolve("ckpt/model.ckpt", ctx).path == store_dir / "model.ckpt-2.h5"
    assert resolve("ckpt", ctx).path == store_dir / "model.ckpt-2.h5"
    # the working directory's pointer (dp freeze without -c)
    assert resolve(str(work), ctx).path == store_dir / "model.ckpt-2.h5"


def test_a_planted_link_to_an_uncommitted_file_outside_is_refused(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "secret.h5").write_bytes(b"not a checkpoint")
    (tmp_path / "model.ckpt-5.h5").write_bytes(b"numbered but unrecorded")
    for planted in ("../secret.h5", "../model.ckpt-5.h5"):
        (work / "checkpoint").write_text(planted)
        with pytest.raises(RestartNotFoundError, match="refusing to follow"):
            resolve(str(work), ResolveContext(FAM, cwd=work))
        os.symlink(planted, work / "model.ckpt.h5")
        with pytest.raises(RestartNotFoundError, match="refusing to follow"):
            resolve("model.ckpt", ResolveContext(FAM, cwd=work))
        os.unlink(work / "model.ckpt.h5")


def test_an_explicit_file_is_hashed_once(tmp_path, monkeypatch):
    from dp_ckpt_plugin.checkpoint import records

    d = tmp_path / "models"
    fill_store(d, [1])
    calls = []
    real = records.digest_of
    monkeypatch.setattr(
        records,
        "digest_of",
        lambda p, a, storage=None: (calls.append(p), real(p, a, storage=storage))[1],
    )
    found = resolve(str(d / "model.ckpt-1.h5"), ResolveContext(FAM, digest=True))
    assert found.checked == "digest" and calls == [d / "model.ckpt-1.h5"]
    # through the front door, which checks what the rule checked: still once
    calls.clear()
    found = resolve_restart(
        Hooks(plugin_manager()),
        str(d / "model.ckpt-1.h5"),
        ResolveContext(FAM, digest=True),
    )
    assert found.checked == "digest" and calls == [d / "model.ckpt-1.h5"]


def test_a_failed_publication_puts_every_mirror_back(tmp_path, monkeypatch):
    work = tmp_path / "work"
    mirrored_store(work, work / "models", work / "ckpt")
    before = {
        p: os.readlink(p) if p.is_symlink() else p.read_text()
        for p in (
            work / "checkpoint",
            work / "ckpt" / "model.ckpt.h5",
            work / "models" / "checkpoint",
        )
    }
    real = LocalStorage.make_link

    def failing(storage, path, target, **kwargs):
        if path.parent == work / "ckpt":
            raise CheckpointWriteError(f"could not update the alias {path}: injected")
        return real(storage, path, target, **kwargs)

    monkeypatch.setattr(LocalStorage, "make_link", failing)
    pm = plugin_manager()
    compat = {"pointer": work / "checkpoint", "alias": work / "ckpt" / "model.ckpt.h5"}
    with make_store(pm, work / "models", keep=0, compat=compat) as store:
        store.resolve("latest")
        with pytest.raises(CheckpointWriteError, match="injected"):
            store.save(3, make_payload(3))
    after = {p: os.readlink(p) if p.is_symlink() else p.read_text() for p in before}
    assert after == before


# -- threads and steps ---------------------------------------------------------------


def test_threads_share_one_store(tmp_path):
    m = open_manager(tmp_path / "m", max_keep=3)
    errors = []
    returned = []
    steps = iter(range(1, 41))
    take = threading.Lock()

    def work():
        try:
            for _ in range(10):
                with take:
                    step = next(steps)
                path = m.save(step, make_payload(step))
                returned.append(path)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(returned) == 40
    # saves finish out of step order: steps above the one being saved are not
    # the window's; one more save, above all, brings the family to the window
    m.save(41, make_payload(41))
    m.close()
    left = committed(tmp_path / "m", FAM)
    for c in left:
        assert read_record(c.path).digest == digest_of(c.path)
    assert [c.step for c in left] == [39, 40, 41]


@pytest.mark.parametrize("step", [5.7, 5.0, True, "5", None, -1])
def test_a_step_is_an_int(tmp_path, step):
    with open_manager(tmp_path / "m") as m:
        with pytest.raises((TypeError, ValueError)):
            m.save(step, make_payload(1))
        assert not (tmp_path / "m").exists()
        assert m.save(np.int64(5), make_payload(5)).name == "model.ckpt-5.h5"


def test_records_of_version_1_with_sha256_still_verify(tmp_path):
    """Old records (format version 1, ``sha256``, ``backend``) stay evidence."""
    import hashlib

    d = tmp_path / "models"
    fill_store(d, [1, 2])
    path = d / "model.ckpt-2.h5"
    rec = d / record_name(path.name)
    raw = json.loads(rec.read_text())
    raw.pop("digest")
    raw["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    raw["backend"] = raw.pop("format")
    raw["format_version"] = 1
    rec.write_text(json.dumps(raw))
    found = resolve("latest", ResolveContext(FAM, store_dir=d, digest=True))
    assert found.path == path and found.checked == "digest"
    assert found.record.digest == "sha256:" + raw["sha256"]
    # and a flipped byte is caught by that sha256
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    found = resolve("latest", ResolveContext(FAM, store_dir=d, digest=True))
    assert found.step == 1


@pytest.mark.parametrize("whose", ["unrecorded", "earlier-run"])
def test_a_save_never_overwrites_a_file_this_run_did_not_write(tmp_path, whose):
    """Rule 12/15: a file at the name being saved is moved into an archive first."""
    d = tmp_path / "models"
    fill_store(d, [1])
    target = d / "model.ckpt-2.h5"
    if whose == "unrecorded":
        target.write_bytes(b"written by plain deepmd-kit")
    else:
        fill_store(tmp_path / "other", [2])
        os.replace(tmp_path / "other" / "model.ckpt-2.h5", target)
        os.replace(
            tmp_path / "other" / record_name(target.name), d / record_name(target.name)
        )
    before = target.read_bytes()
    with open_manager(d, max_keep=0) as m:
        m.store.resolve(str(d / "model.ckpt-1.h5"))  # continue from step 1
        m.save(2, make_payload(2))
        assert_same(m.restore("latest").state, make_payload(2))
    kept = [p for p in (d / "archive").rglob("model.ckpt-2.h5")]
    assert len(kept) == 1 and kept[0].read_bytes() == before
