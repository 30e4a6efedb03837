"""Rules 16-21: resolving ``latest``, directories, files and prefixes."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from helpers import fill_store, make_payload, open_manager, payload_mismatches

from dp_ckpt_plugin import CorruptCheckpointError, RestartNotFoundError
from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.resolution import ResolveContext
from dp_ckpt_plugin.resolution.builtin import resolve

FAM = Family("model.ckpt", ".h5")


def ctx(tmp_path, **kwargs):
    kwargs.setdefault("cwd", tmp_path)
    return ResolveContext(family=FAM, **kwargs)


def test_latest_reads_the_store_pointer_not_the_highest_step(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2, 3])
    (d / "checkpoint").write_text(
        "model.ckpt-2.h5\n"
    )  # e.g. a re-run that published 2 last
    assert resolve("latest", ctx(tmp_path, store_dir=Path("models"))).step == 2


def test_latest_without_store_uses_deepmd_pointer_then_alias(tmp_path):
    # deepmd-kit 3.2.0's own layout: numbered files beside the prefix,
    # `checkpoint` in the working directory, alias beside the prefix
    (tmp_path / "out").mkdir()
    for step in (1, 2):
        (tmp_path / "out" / f"model.ckpt-{step}.h5").write_bytes(b"x" * step)
    (tmp_path / "checkpoint").write_text("out/model.ckpt-2.h5")
    os.symlink("model.ckpt-1.h5", tmp_path / "out" / "model.ckpt.h5")
    c = ctx(tmp_path, prefix_path=Path("out/model.ckpt"))
    found = resolve("latest", c)
    assert (
        found.path == tmp_path / "out" / "model.ckpt-2.h5"
        and found.checked == "unverified"
    )
    (tmp_path / "checkpoint").unlink()
    assert resolve("latest", c).path == tmp_path / "out" / "model.ckpt-1.h5"


def test_latest_spec_is_not_a_file_name(tmp_path):
    # a stray file called latest.h5 must not shadow the handle
    d = tmp_path / "models"
    fill_store(d, [4])
    (tmp_path / "latest.h5").write_bytes(b"junk")
    assert resolve("latest", ctx(tmp_path, store_dir=d)).step == 4


def test_directory_pointer_then_alias_then_newest(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2, 3])
    assert resolve(str(d), ctx(tmp_path)).how.startswith("pointer")
    (d / "checkpoint").unlink()
    os.replace(d / "model.ckpt.h5", d / "x")
    os.symlink("model.ckpt-2.h5", d / "model.ckpt.h5")
    found = resolve(str(d), ctx(tmp_path))
    assert found.step == 2 and found.how.startswith("alias")
    (d / "model.ckpt.h5").unlink()
    found = resolve(str(d), ctx(tmp_path))
    assert found.step == 3 and found.how.startswith("newest")


def test_directory_uses_its_own_pointer_never_another_runs(tmp_path):
    fill_store(tmp_path / "run_a", [1, 2])
    fill_store(tmp_path / "run_b", [7])
    # the working directory's compat pointer names run_a; asking for run_b
    # must give run_b's checkpoint
    (tmp_path / "checkpoint").write_text("run_a/model.ckpt-2.h5")
    assert (
        resolve(
            str(tmp_path / "run_b"), ctx(tmp_path, store_dir=tmp_path / "run_a")
        ).step
        == 7
    )


def test_file_is_itself_and_prefix_is_its_alias(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    assert resolve(str(d / "model.ckpt-1.h5"), ctx(tmp_path)).step == 1
    assert resolve("models/model.ckpt-1.h5", ctx(tmp_path)).step == 1
    found = resolve(str(d / "model.ckpt"), ctx(tmp_path))
    assert found.path == d / "model.ckpt-2.h5"


@pytest.mark.parametrize(
    "content",
    ["/etc/passwd", "../outside.h5", "../../etc/hostname", "sub/../../outside.h5"],
)
def test_pointer_escaping_its_directory_is_never_followed(tmp_path, content, caplog):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    (tmp_path / "outside.h5").write_bytes(b"not yours")
    (d / "checkpoint").write_text(content)
    os.unlink(d / "model.ckpt.h5")
    with caplog.at_level(logging.WARNING):
        found = resolve(str(d), ctx(tmp_path))
    # the escape is refused and reported; the store's own newest is used
    assert found.path == d / "model.ckpt-2.h5"
    assert any("outside" in w and "refusing" in w for w in found.warnings)


def test_symlinked_target_leading_out_is_refused(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1])
    secret = tmp_path / "secret.h5"
    secret.write_bytes(b"secret")
    os.symlink(secret, d / "model.ckpt-9.h5")
    (d / "checkpoint").write_text("model.ckpt-9.h5")
    os.unlink(d / "model.ckpt.h5")
    os.symlink(secret, d / "model.ckpt.h5")
    found = resolve(str(d), ctx(tmp_path))
    assert found.path == d / "model.ckpt-1.h5"


def test_compat_pointer_in_working_directory_may_lead_into_the_store(tmp_path):
    store = tmp_path / "scratch" / "models"
    work = tmp_path / "work"
    work.mkdir()
    fill_store(store, [3])
    (work / "checkpoint").write_text(str(store / "model.ckpt-3.h5"))
    assert resolve(str(work), ctx(work, store_dir=store)).step == 3
    # without knowing the store, it is followed because its target is provably
    # ours: a committed checkpoint whose record agrees (rule 19)
    assert resolve(str(work), ctx(work)).step == 3
    # the same pointer to a file without a record is an escape, refused
    (store / ".model.ckpt-3.h5.commit.json").unlink()
    with pytest.raises(RestartNotFoundError, match="refusing to follow"):
        resolve(str(work), ctx(work))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_newest_is_moved_aside_and_previous_used(tmp_path, damage, caplog):
    d = tmp_path / "models"
    fill_store(d, [1, 2, 3])
    newest = d / "model.ckpt-3.h5"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        found = resolve("latest", ctx(tmp_path, store_dir=d, digest=True))
    assert found.step == 2
    assert not newest.exists()
    moved = list((d / "quarantine").iterdir())
    assert any(
        p.name.startswith("model.ckpt-3.h5.") and not p.name.endswith(".json")
        for p in moved
    )
    text = "\n".join(found.warnings)
    assert "model.ckpt-3.h5" in text and "model.ckpt-2.h5" in text
    # the rules return their warnings; the caller says them, once
    assert "model.ckpt-3.h5" not in caplog.text


def test_the_manager_says_each_warning_of_a_restore_once(tmp_path, caplog):
    d = tmp_path / "models"
    fill_store(d, [1, 2, 3])
    newest = d / "model.ckpt-3.h5"
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.WARNING), open_manager(d, verify="digest") as m:
        restored = m.restore("latest")
    assert restored.step == 2
    said = [
        r.getMessage() for r in caplog.records if "model.ckpt-3.h5" in r.getMessage()
    ]
    assert len(said) == len(restored.resolved.warnings) - 1 >= 1, said


def test_size_check_is_always_on(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    with open(d / "model.ckpt-2.h5", "ab") as fh:
        fh.write(b"\0")
    assert resolve("latest", ctx(tmp_path, store_dir=d, digest=False)).step == 1


def test_flipped_byte_passes_size_check_but_not_sha256(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    data = bytearray((d / "model.ckpt-2.h5").read_bytes())
    data[-5] ^= 1
    (d / "model.ckpt-2.h5").write_bytes(bytes(data))
    assert (
        resolve(
            "latest", ctx(tmp_path, store_dir=d, digest=False, quarantine=False)
        ).step
        == 2
    )
    assert resolve("latest", ctx(tmp_path, store_dir=d, digest=True)).step == 1


def test_explicitly_named_corrupt_file_is_an_error_not_a_fallback(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    with open(d / "model.ckpt-2.h5", "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(CorruptCheckpointError, match=r"model\.ckpt-2\.h5"):
        resolve(str(d / "model.ckpt-2.h5"), ctx(tmp_path))
    assert (d / "model.ckpt-2.h5").exists()  # named explicitly: reported, not moved


def test_unrecorded_checkpoint_accepted_when_named_or_pointed_at(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    (d / "model.ckpt-5.h5").write_bytes(b"from plain deepmd-kit")
    found = resolve(str(d / "model.ckpt-5.h5"), ctx(tmp_path))
    assert found.checked == "unverified" and found.step == 5
    # the rule says nothing of it: the front door checks it by its own
    # checksums (rule 50, test_carried_checksums.py)
    assert found.warnings == []
    # found by its directory's pointer: accepted the same way
    (d / "checkpoint").write_text("model.ckpt-5.h5")
    assert resolve(str(d), ctx(tmp_path)).checked == "unverified"
    # not by "newest numbered": only committed files count there
    (d / "checkpoint").unlink()
    with pytest.raises(RestartNotFoundError, match="without a commit record"):
        resolve(str(d), ctx(tmp_path))


def test_nothing_found_lists_every_place_looked_at(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RestartNotFoundError) as info:
        resolve("latest", ctx(tmp_path, store_dir=tmp_path / "empty"))
    text = str(info.value)
    for place in [
        "pointer",
        "checkpoint",
        "alias",
        "model.ckpt.h5",
        "committed model.ckpt-<step>.h5",
    ]:
        assert place in text
    with pytest.raises(RestartNotFoundError) as info:
        resolve("nope/model.ckpt", ctx(tmp_path))
    assert "nope/model.ckpt.h5" in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"\n\n", b"\x00\x01\x02binary", b"\xff\xfe", b"a.h5\nb.h5", b"x" * 5000],
)
def test_malformed_pointer_is_reported_and_skipped(tmp_path, content):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    (d / "checkpoint").write_bytes(content)
    os.unlink(d / "model.ckpt.h5")
    found = resolve(str(d), ctx(tmp_path))
    assert found.step == 2
    assert any("pointer" in w for w in found.warnings)


def test_pointer_to_missing_file_falls_back(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    (d / "checkpoint").write_text("model.ckpt-99.h5")
    found = resolve(str(d), ctx(tmp_path))
    assert found.step == 2  # via the alias
    assert any("does not exist" in w for w in found.warnings)


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_broken_alias_falls_back(tmp_path, kind):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    (d / "checkpoint").unlink()
    os.unlink(d / "model.ckpt.h5")
    if kind == "dangling":
        os.symlink("model.ckpt-77.h5", d / "model.ckpt.h5")
    else:
        os.symlink("model.ckpt.h5", d / "model.ckpt.h5")
    found = resolve(str(d), ctx(tmp_path))
    assert found.step == 2 and any("dangles or loops" in w for w in found.warnings)


def test_record_lying_about_size_is_corrupt(tmp_path):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    rec = d / ".model.ckpt-2.h5.commit.json"
    rec.write_text(rec.read_text().replace('"size": ', '"size": 1'))
    assert resolve("latest", ctx(tmp_path, store_dir=d)).step == 1


@pytest.mark.parametrize(
    "text",
    ["{", "[]", '{"name": "model.ckpt-2.h5"}', '{"format_version": 99}', "\xff"],
)
def test_malformed_record_means_not_committed(tmp_path, text):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    shutil.copy(d / ".model.ckpt-2.h5.commit.json", tmp_path / "rec")
    (d / ".model.ckpt-2.h5.commit.json").write_text(text)
    (d / "checkpoint").unlink()
    os.unlink(d / "model.ckpt.h5")
    assert resolve(str(d), ctx(tmp_path)).step == 1


def test_restore_reads_exact_content(tmp_path, make_manager):
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    r = make_manager(d).restore(str(d / "model.ckpt-1.h5"))
    assert payload_mismatches(r.state, 1) == []


def test_primary_family_is_read_from_commit_records(tmp_path, pm):
    from dp_ckpt_plugin import CheckpointStore, FamilyConfig
    from dp_ckpt_plugin.deepmd.naming import ema_family, primary_family_in

    d = tmp_path / "models"
    run = Family("run.ckpt", ".h5")
    families = [FamilyConfig(run), FamilyConfig(ema_family(run))]
    with CheckpointStore(d, format="hdf5", pm=pm, families=families) as store:
        store.save(1, make_payload(1))
        store.save(1, make_payload(1), family="run_ema.ckpt")
    assert primary_family_in(d, ".h5", FAM) == Family("run.ckpt", ".h5")
    # without its pointer the directory still resolves, for that family
    (d / "checkpoint").unlink()
    c = ctx(tmp_path)
    c.family = primary_family_in(d, ".h5", FAM)
    assert resolve(str(d), c).path == d / "run.ckpt-1.h5"
    # an empty or unknown directory keeps the default
    (tmp_path / "empty").mkdir()
    assert primary_family_in(tmp_path / "empty", ".h5", FAM) == FAM


def test_latest_in_a_store_plain_deepmd_wrote(tmp_path):
    # deepmd-kit 3.2 with save_dir: numbered files in models/, no records,
    # its pointer in the working directory; the plugin is installed afterwards
    d = tmp_path / "models"
    d.mkdir()
    for step in (15, 20):
        (d / f"model.ckpt-{step}.h5").write_bytes(b"plain" * step)
    (tmp_path / "checkpoint").write_text("models/model.ckpt-20.h5")
    fallback = (tmp_path / "checkpoint",)  # the host's pointer mirror
    # a store configured without that mirror does not look there
    with pytest.raises(RestartNotFoundError):
        resolve("latest", ctx(tmp_path, store_dir=Path("models")))
    found = resolve(
        "latest", ctx(tmp_path, store_dir=Path("models"), fallback_pointers=fallback)
    )
    assert found.path == d / "model.ckpt-20.h5" and found.checked == "unverified"
    # a working-directory pointer leading anywhere else is not followed
    (tmp_path / "elsewhere.h5").write_bytes(b"x")
    (tmp_path / "checkpoint").write_text("elsewhere.h5")
    with pytest.raises(RestartNotFoundError, match="outside"):
        resolve(
            "latest",
            ctx(tmp_path, store_dir=Path("models"), fallback_pointers=fallback),
        )


def test_corrupt_target_met_twice_is_reported_once(tmp_path):
    # freeze resolves without moving files: pointer and alias both lead to
    # the corrupt newest checkpoint; it is reported once, the previous used
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    with open(d / "model.ckpt-2.h5", "ab") as fh:
        fh.write(b"torn")
    found = resolve(str(d), ctx(tmp_path, quarantine=False))
    assert found.step == 1
    assert sum("model.ckpt-2.h5 has" in w for w in found.warnings) == 1
    assert (d / "model.ckpt-2.h5").exists()


def test_latest_that_finds_nothing_points_at_the_archive(tmp_path):
    """A fresh run that archived the earlier one, then failed its first save."""
    d = tmp_path / "models"
    fill_store(d, [1, 2])
    archived = d / "archive" / "20260101T000000Z"
    archived.mkdir(parents=True)
    for name in os.listdir(d):
        if name != "archive":
            os.replace(d / name, archived / name)
    with pytest.raises(RestartNotFoundError, match="archived in") as info:
        resolve("latest", ctx(tmp_path, store_dir=d))
    assert str(archived) in str(info.value)
