"""Provenance in commit records and the restart's account of what changed (rules 51, 52).

A record carries where its checkpoint came from; the training input is kept
once per digest beside the checkpoints and outlives retention while a kept
checkpoint names it; nothing secret is kept; records without provenance
are read as before. What changed since a checkpoint is said one line per
change, on real data systems and deepmd-kit's own normalization.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from e2e_support import example_config, make_data
from helpers import make_payload, open_manager

from dp_ckpt_plugin.checkpoint.provenance import (
    INPUTS_DIR,
    DataIdentity,
    DataSystem,
    Provenance,
    canonical,
    input_digest,
    read_input,
    scrubbed,
)
from dp_ckpt_plugin.checkpoint.records import parse_record, read_record
from dp_ckpt_plugin.deepmd.exact import Continuation, ExactResume, restart_line
from dp_ckpt_plugin.deepmd.origin import changes_since, run_origin
from dp_ckpt_plugin.errors import InvalidRecordError

NOT_EXACT = re.compile(r"resume at step (\d+) is not exact: (.+?); the batches")
EXACT = re.compile(r"exact resume at step (\d+): random generators and data position")
SECRET = "hunter2-very-secret"


def _inputs(directory: Path) -> list[Path]:
    return sorted((directory / INPUTS_DIR).glob("*.json"))


# -- records -------------------------------------------------------------------------


def test_a_record_names_its_origin_and_the_input_is_kept_once(tmp_path):
    config = {"training": {"numb_steps": 3, "seed": 5}, "model": {"rcut": 6.0}}
    with open_manager(tmp_path, training_input=config, seed=5, max_keep=1) as m:
        for step in (1, 2, 3):
            m.save(step, make_payload(step))
    record = read_record(tmp_path / "model.ckpt-3.h5")
    origin = record.provenance
    assert origin.plugin and origin.python and origin.world_size == 1
    assert origin.seed == 5 and origin.input == input_digest(config)
    (kept,) = _inputs(tmp_path)
    assert kept.read_bytes() == canonical(config)
    assert read_input(tmp_path, origin.input, storage=_storage()) == config
    # a second run with another input keeps a second file; the first stays
    # while a kept checkpoint names it (retention removes checkpoints only),
    # and the earlier run's checkpoint, archived, still finds its input
    other = copy.deepcopy(config)
    other["training"]["numb_steps"] = 9
    with open_manager(tmp_path, training_input=other, max_keep=5) as m:
        m.save(4, make_payload(4))
    assert len(_inputs(tmp_path)) == 2
    (archived,) = (tmp_path / "archive").glob("*/model.ckpt-3.h5")
    digest = read_record(archived).provenance.input
    assert read_input(archived.parent, digest, storage=_storage()) == config


def _storage():
    from dp_ckpt_plugin.storage import default_storage

    return default_storage()


def test_nothing_secret_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_CKPT_TEST_SECRET", SECRET)
    config = {
        "training": {
            "save_dir": f"s3://user:{SECRET}@bucket/run",
            "endpoint": f"https://{SECRET}@example.org/x",
            "aws_secret_access_key": SECRET,
            "password": SECRET,
        }
    }
    with open_manager(tmp_path, training_input=config) as m:
        m.save(1, make_payload(1))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    kept = json.loads(_inputs(tmp_path)[0].read_text("utf-8"))
    assert set(kept["training"]) == {"save_dir", "endpoint"}
    assert scrubbed(config)["training"]["save_dir"] == "s3://***@bucket/run"


def test_a_record_without_provenance_is_still_read():
    base = {
        "name": "model.ckpt-5.h5",
        "step": 5,
        "family": "model.ckpt",
        "format": "hdf5",
        "size": 10,
        "digest": "blake3:" + "ab" * 32,
        "created": 1.0,
        "format_version": 2,
    }
    record = parse_record(json.dumps(base), source="r", name="model.ckpt-5.h5")
    assert record.provenance is None
    v1 = dict(base, format_version=1, sha256="cd" * 32)
    del v1["digest"]
    assert (
        parse_record(json.dumps(v1), source="r", name="model.ckpt-5.h5").provenance
        is None
    )


@pytest.mark.parametrize(
    "provenance",
    [
        "nope",
        {"python": "3.11"},
        {"plugin": "0.3", "python": "3.11", "world_size": 0},
        {"plugin": "0.3", "python": "3.11", "seed": "7"},
        {"plugin": "0.3", "python": "3.11", "input": "md5:00"},
        {"plugin": "0.3", "python": "3.11", "data": {"count": 1, "systems": [1]}},
    ],
    ids=["not-object", "no-plugin", "world-0", "seed-text", "digest", "data"],
)
def test_a_malformed_provenance_means_not_committed(provenance):
    record = {
        "name": "model.ckpt-5.h5",
        "step": 5,
        "family": "model.ckpt",
        "format": "hdf5",
        "size": 10,
        "digest": "blake3:" + "ab" * 32,
        "format_version": 2,
        "provenance": provenance,
    }
    with pytest.raises(InvalidRecordError, match="provenance") as caught:
        parse_record(json.dumps(record), source="r", name="model.ckpt-5.h5")
    assert "\n" not in str(caught.value)


def test_many_data_systems_are_counted_and_digested_not_listed():
    many = [DataSystem("training", f"s{i}", "sha256:" + "0" * 64) for i in range(40)]
    data = DataIdentity.of(many)
    assert data.count == 40 and data.systems == ()
    assert DataIdentity.of(many[:2]).systems == tuple(many[:2])
    Provenance("0.3", "3.11", data=data).check()


# -- what changed since a checkpoint ---------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("origin")
    make_data(root / "data", frames=6)
    return root


def _origin(workdir: Path, config: dict, world_size: int = 1):
    provenance, normalized = run_origin(
        config, cwd=workdir, backend="pt", world_size=world_size
    )
    from dataclasses import replace

    return replace(provenance, input=input_digest(normalized)), normalized


def test_nothing_changed_says_nothing_and_a_restart_is_exact(workdir):
    config = example_config(numb_steps=20)
    old = _origin(workdir, config)
    again = copy.deepcopy(config)
    again["training"]["disp_freq"] = 1  # display, saving: not the trajectory
    again["training"]["save_freq"] = 2
    found = changes_since(*old, *_origin(workdir, again))
    assert found.lines == [] and found.data is None and found.unknown is None
    line = restart_line(20, Continuation({"rng": {}}), found)
    assert EXACT.findall(line) == ["20"]


def test_numb_steps_changed_is_not_exact_and_says_why(workdir):
    old = _origin(workdir, example_config(numb_steps=20))
    found = changes_since(*old, *_origin(workdir, example_config(numb_steps=30)))
    assert found.lines == [
        "training.numb_steps 20 -> 30, the learning-rate schedule and loss "
        "prefactors follow numb_steps"
    ]
    assert found.data is None  # the batches are still restored
    line = restart_line(20, Continuation({"rng": {}}), found)
    assert NOT_EXACT.findall(line) == [("20", found.lines[0])]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda c, w: c["model"]["descriptor"].update(neuron=[4, 16]),
            ["model.descriptor.neuron [4, 8] -> [4, 16]: the model changed"],
        ),
        (
            lambda c, w: c["training"].update(seed=8),
            ["training.seed 1 -> 8, a run of this input draws other random numbers"],
        ),
        (
            lambda c, w: c["learning_rate"].update(start_lr=0.02),
            ["learning_rate.start_lr 0.01 -> 0.02: the optimization differs"],
        ),
    ],
    ids=["model", "seed", "learning-rate"],
)
def test_each_change_has_its_line(workdir, change, expected):
    config = example_config()
    old = _origin(workdir, config)
    new = copy.deepcopy(config)
    change(new, workdir)
    found = changes_since(*old, *_origin(workdir, new))
    assert [
        line[: len(e)] for line, e in zip(found.lines, expected, strict=False)
    ] == expected
    assert len(found.lines) == len(expected) and found.data is None


def test_data_added_removed_or_changed_cannot_restore_the_position(workdir):
    config = example_config()
    old = _origin(workdir, config)
    shutil.copytree(workdir / "data" / "train", workdir / "data" / "more")
    added = copy.deepcopy(config)
    added["training"]["training_data"]["systems"] = ["data/train", "data/more"]
    found = changes_since(*old, *_origin(workdir, added))
    assert found.lines == [
        "training system data/more added: the data position cannot be restored"
    ]
    assert found.data == "the data changed since the checkpoint"
    # the files of a system change: its fingerprint does
    before = _origin(workdir, added)
    type_raw = workdir / "data" / "more" / "type.raw"
    type_raw.write_text(type_raw.read_text() + "\n")
    found = changes_since(*before, *_origin(workdir, added))
    assert found.lines == [
        "training system data/more changed (its files differ): the data "
        "position cannot be restored"
    ]
    removed = changes_since(*before, *_origin(workdir, config))
    assert removed.lines == [
        "training system data/more removed: the data position cannot be restored"
    ]
    # a trainer told so restores nothing
    resume = ExactResume(changed=found.data)
    assert resume.continuation({"ranks": [{}]}).reason == found.data


def test_world_size_and_an_unknown_origin(workdir):
    config = example_config()
    found = changes_since(*_origin(workdir, config, 2), *_origin(workdir, config, 1))
    assert found.lines == ["world size 2 -> 1: each rank draws other batches"]
    unknown = changes_since(None, None, *_origin(workdir, config))
    assert unknown.lines == [] and "records no provenance" in unknown.unknown


def test_another_backend_or_deepmd_kit_or_torch_is_a_change(workdir):
    from dataclasses import replace

    config = example_config()
    old, old_input = _origin(workdir, config)
    new, new_input = _origin(workdir, config)
    older = replace(old, backend="pt_expt", deepmd_kit="3.2.0", torch="2.0.0")
    newer = replace(new, backend="pt", deepmd_kit="3.2.1", torch="2.1.0")
    found = changes_since(older, old_input, newer, new_input)
    assert found.lines == [
        "backend pt_expt -> pt: another trainer continues the run",
        "deepmd-kit 3.2.0 -> 3.2.1: another trainer continues the run",
        "torch 2.0.0 -> 2.1.0: its kernels may round otherwise",
    ]


def _json_of(capsys, *args):
    from dp_ckpt_plugin.commands import main

    capsys.readouterr()
    assert main([*map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_remote_store_keeps_the_input_for_another_node(tmp_path, capsys):
    """The input goes to ``inputs/`` of the object store, once; a node with
    nothing staged reads it back from there."""
    from doubles.memory import MemoryStorage, forget
    from helpers import plugin_manager, remote_store

    from dp_ckpt_plugin.checkpoint.provenance import provenance_of

    url = f"memory://prov{tmp_path.name[-8:].replace('_', '')}/run"
    storage = MemoryStorage(url)
    try:
        config = {"training": {"numb_steps": 3}}
        store = remote_store(plugin_manager(), tmp_path / "node_a", storage)
        store.committer.describe_origin(provenance_of(), config)
        for step in (1, 2):
            store.save(step, make_payload(step))
        store.close()
        kept = [o.key for o in storage.list("inputs/")]
        assert kept == [f"inputs/sha256-{input_digest(config)[7:]}.json"]
        shown = _json_of(capsys, "resolve", "latest", "--dir", url)
        assert shown["provenance"]["input"] == input_digest(config)
        assert shown["input"] == config
        other = remote_store(plugin_manager(), tmp_path / "node_b", storage)
        assert other.remote.read_input(input_digest(config)) == config
        assert other.remote.read_input("sha256:" + "0" * 64) is None
    finally:
        forget(url.split("/")[2])


def test_sync_carries_the_inputs_both_ways(tmp_path, capsys):
    """``dp-ckpt sync`` down and up: the inputs the records name come along."""
    from doubles.memory import MemoryStorage, forget
    from helpers import plugin_manager, remote_store

    from dp_ckpt_plugin.checkpoint.provenance import provenance_of
    from dp_ckpt_plugin.commands import main

    name = f"sync{tmp_path.name[-8:].replace('_', '')}"
    url, again = f"memory://{name}/run", f"memory://{name}up/run"
    try:
        config = {"training": {"numb_steps": 2}}
        store = remote_store(plugin_manager(), tmp_path / "stage", MemoryStorage(url))
        store.committer.describe_origin(provenance_of(), config)
        store.save(1, make_payload(1))
        store.close()
        local = tmp_path / "copy"
        assert main(["sync", url, str(local)]) == 0
        digest = read_record(local / "model.ckpt-1.h5").provenance.input
        assert read_input(local, digest, storage=_storage()) == config
        assert main(["sync", str(local), again]) == 0
        kept = [o.key for o in MemoryStorage(again).list("inputs/")]
        assert kept == [f"inputs/sha256-{digest[7:]}.json"]
        capsys.readouterr()
    finally:
        forget(name)
        forget(f"{name}up")


def test_an_inputs_link_out_of_the_store_is_never_written_through(tmp_path, caplog):
    """``D/inputs`` a link to elsewhere: nothing is written there, the save stands."""
    outside = tmp_path / "outside"
    outside.mkdir()
    store = tmp_path / "models"
    store.mkdir()
    (store / INPUTS_DIR).symlink_to(outside)
    with open_manager(store, training_input={"training": {"seed": 1}}) as m:
        m.save(1, make_payload(1))
    assert list(outside.iterdir()) == []
    assert read_record(store / "model.ckpt-1.h5").provenance.input is not None
    assert "the training input is not kept" in caplog.text
