"""The integration's preflight: validate, lock and resolve before anything is built."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fill_store, flipped, needs_torch, zip_member_spans

from dp_ckpt_plugin import (
    ConfigError,
    RestartNotFoundError,
    StoreLockedError,
)
from dp_ckpt_plugin.ranks import SingleProcess
from dp_ckpt_plugin.store.lock import StoreLock

pytest.importorskip("deepmd")

from dp_ckpt_plugin.deepmd.prepare import prepare_run


def write_input(tmp_path, **training):
    training = {
        "save_dir": "models",
        "numb_steps": 10,
        "_dp_ckpt": {"verify": "digest", "stop_signals": []},
        **training,
    }
    config = {"training": training}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def run_in(tmp_path, monkeypatch, pm):
    monkeypatch.chdir(tmp_path)

    def run(input_file, **kwargs):
        kwargs.setdefault("restart", None)
        kwargs.setdefault("init_model", None)
        kwargs.setdefault("host", "pt_expt")
        prepared = prepare_run(input_file, pm=pm, ranks=SingleProcess(), **kwargs)
        if prepared.store is not None:
            prepared.store.close()
        return prepared

    return run


@needs_torch
def test_restart_and_init_model_latest_resolve_to_the_store(tmp_path, run_in):
    fill_store(tmp_path / "models", [5, 10], "torch")
    cfg = write_input(tmp_path)
    assert run_in(cfg, restart="latest").restart == str(
        tmp_path / "models" / "model.ckpt-10.pt"
    )
    prepared = run_in(cfg, init_model="latest")
    assert prepared.init_model == str(tmp_path / "models" / "model.ckpt-10.pt")
    assert prepared.resumed_from == tmp_path / "models" / "model.ckpt-10.pt"


@needs_torch
def test_latest_follows_save_ckpt(tmp_path, run_in):
    fill_store(tmp_path / "models", [3], "torch", prefix="run.ckpt")
    cfg = write_input(tmp_path, save_ckpt="run.ckpt")
    assert run_in(cfg, restart="latest").restart.endswith("models/run.ckpt-3.pt")


def test_bad_handle_lists_places(tmp_path, run_in):
    cfg = write_input(tmp_path)
    with pytest.raises(RestartNotFoundError, match="looked at"):
        run_in(cfg, restart="latest")


def test_lock_is_taken_before_anything_is_built(tmp_path, run_in):
    (tmp_path / "models").mkdir()
    holder = StoreLock(tmp_path / "models")
    holder.acquire()
    try:
        with pytest.raises(StoreLockedError, match=f"pid {__import__('os').getpid()}"):
            run_in(write_input(tmp_path))
    finally:
        holder.release()


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"save_dir": 3}, "training.save_dir"),
        ({"save_dir": ""}, "training.save_dir"),
        ({"save_ckpt": "dir/"}, "training.save_ckpt"),
    ],
)
def test_configuration_mistakes(tmp_path, run_in, training, message):
    with pytest.raises(ConfigError, match=message):
        run_in(write_input(tmp_path, **training))


def test_the_top_level_section_of_0_2_ends_the_run_in_one_line(tmp_path, run_in):
    path = tmp_path / "input.json"
    config = json.loads(Path(write_input(tmp_path)).read_text())
    config["dp_ckpt"] = config["training"].pop("_dp_ckpt")
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as caught:
        run_in(str(path))
    assert str(caught.value) == (
        "the top-level `dp_ckpt` section is `training._dp_ckpt` since 0.3"
    )
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("host", ["pt_expt", "pt"])
def test_keep_best_without_displayed_metrics_is_refused_before_anything(
    tmp_path, run_in, host
):
    retention = {"verify": "size", "retention": {"keep_best": 2}}
    cfg = write_input(tmp_path, disp_training=False, _dp_ckpt=retention)
    with pytest.raises(ConfigError, match=r"retention/keep_best.*disp_training"):
        run_in(cfg, host=host)
    assert not (tmp_path / "models").exists()


def test_a_backend_that_reports_no_metrics_refuses_keep_best_naming_both(
    tmp_path, run_in, monkeypatch
):
    from dataclasses import replace

    from dp_ckpt_plugin.deepmd import host as hosts
    from dp_ckpt_plugin.deepmd.pt import DESCRIPTOR

    mute = replace(DESCRIPTOR, reports_metrics=False)
    monkeypatch.setattr(hosts, "descriptor", lambda name: mute)
    import dp_ckpt_plugin.deepmd.prepare as prepare

    monkeypatch.setattr(prepare, "descriptor", lambda name: mute)
    cfg = write_input(tmp_path, _dp_ckpt={"retention": {"keep_best": 1}})
    with pytest.raises(
        ConfigError, match=r"`training/_dp_ckpt/retention/keep_best`.*dp --pt"
    ):
        run_in(cfg, host="pt")
    assert not (tmp_path / "models").exists()


def test_every_backend_reports_metrics():
    """Both deepmd-kit backends record the displayed learning curve (keep_best works)."""
    from dp_ckpt_plugin.deepmd.host import descriptors

    assert all(d.reports_metrics for d in descriptors())


def test_missing_input(tmp_path, run_in):
    with pytest.raises(ConfigError, match="does not exist"):
        run_in(str(tmp_path / "nope.json"))


def test_preflight_imports_no_torch(tmp_path):
    cfg = write_input(tmp_path)
    code = (
        "import sys\n"
        "from dp_ckpt_plugin import get_plugin_manager\n"
        "from dp_ckpt_plugin.ranks import SingleProcess\n"
        "from dp_ckpt_plugin.deepmd.prepare import prepare_run\n"
        f'p = prepare_run({cfg!r}, restart=None, init_model=None, pm=get_plugin_manager(), ranks=SingleProcess(), host="pt_expt")\n'
        "p.store.close()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False", out.stderr


# -- a failed start leaves nothing -------------------------------------------------


def test_a_failed_start_removes_the_lock_and_the_directory_it_made(tmp_path, run_in):
    cfg = write_input(tmp_path)
    with pytest.raises(RestartNotFoundError):
        run_in(cfg, restart="nowhere")
    assert not (tmp_path / "models").exists()


def test_a_failed_start_in_an_existing_directory_leaves_only_what_was_there(
    tmp_path, run_in
):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "notes.txt").write_text("mine")
    with pytest.raises(RestartNotFoundError):
        run_in(write_input(tmp_path), restart="nowhere")
    assert os.listdir(tmp_path / "models") == ["notes.txt"]


def test_a_clean_close_leaves_no_lock_files(tmp_path, run_in):
    prepared = run_in(write_input(tmp_path))
    prepared.close()  # idempotent after the fixture's close
    assert os.listdir(tmp_path / "models") == []


# -- handles -------------------------------------------------------------------------


@needs_torch
def test_finetune_latest_resolves_and_starts_its_own_count(tmp_path, run_in, caplog):
    fill_store(tmp_path / "models", [5, 10], "torch")
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        prepared = run_in(write_input(tmp_path), finetune="latest")
    assert prepared.finetune == str(tmp_path / "models" / "model.ckpt-10.pt")
    assert prepared.restart is None
    text = caplog.text
    assert "--finetune latest: models/model.ckpt-10.pt (step 10)" in text
    assert "this run starts its own step count" in text


@needs_torch
def test_restart_handle_is_normalized(tmp_path, run_in):
    fill_store(tmp_path / "models", [5], "torch")
    (tmp_path / "run").mkdir()
    prepared = run_in(write_input(tmp_path), restart="run/../models")
    assert prepared.restart == str(tmp_path / "models" / "model.ckpt-5.pt")


def test_startup_line_says_version_save_dir_retention_and_verify(
    tmp_path, run_in, caplog
):
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        run_in(write_input(tmp_path, max_ckpt_keep=3))
    (line,) = [
        r.getMessage() for r in caplog.records if "dp_ckpt_plugin 0" in r.getMessage()
    ]
    assert "(dp --pt-expt): save_dir models, keep the newest 3, verify digest" in line


# -- adopting what plain deepmd-kit wrote ---------------------------------------------


def plain_files(directory, steps, prefix="model.ckpt"):
    """Numbered files as plain deepmd-kit writes them: no records, no pointer."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        torch.save(
            {"model": {"w": torch.full((2,), float(step))}},
            directory / f"{prefix}-{step}.pt",
        )


@needs_torch
def test_plain_save_dir_is_adopted(tmp_path, run_in, caplog):
    from dp_ckpt_plugin.checkpoint.records import read_record

    models = tmp_path / "models"
    plain_files(models, [5, 10])
    plain_files(models, [10], prefix="model_ema.ckpt")
    (models / "model.ckpt-7.pt").write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        prepared = run_in(write_input(tmp_path), restart="models")
    assert prepared.restart == str(models / "model.ckpt-10.pt")
    for name in ("model.ckpt-5.pt", "model.ckpt-10.pt", "model_ema.ckpt-10.pt"):
        assert read_record(models / name) is not None, name
    assert read_record(models / "model.ckpt-7.pt") is None
    assert (models / "checkpoint").read_text().strip() == "model.ckpt-10.pt"
    assert os.readlink(models / "model_ema.ckpt.pt") == "model_ema.ckpt-10.pt"
    text = caplog.text
    assert (
        "adopted 3 checkpoint(s) that plain deepmd-kit wrote in models (steps 5, 10)"
        in text
    )
    assert "model.ckpt-7.pt has no commit record and does not load with torch" in text
    assert "adopted from plain deepmd-kit" in text


@needs_torch
def test_a_damaged_plain_file_is_not_adopted_and_its_member_is_named(
    tmp_path, run_in, caplog
):
    """Rule 45: adoption checks a file's own CRC32s before it gives a record."""
    from dp_ckpt_plugin.checkpoint.records import read_record

    models = tmp_path / "models"
    plain_files(models, [5, 10])
    path = models / "model.ckpt-10.pt"
    data = path.read_bytes()
    name, start, size = zip_member_spans(data)[0]
    path.write_bytes(flipped(data, start + size // 2))
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        prepared = run_in(write_input(tmp_path), restart="models/model.ckpt-5.pt")
    assert prepared.restart == str(models / "model.ckpt-5.pt")
    assert read_record(models / "model.ckpt-10.pt") is None
    assert f"is damaged: member {name} of its zip archive" in caplog.text


@needs_torch
def test_adoption_leaves_a_malformed_record_alone(tmp_path, run_in):
    models = tmp_path / "models"
    plain_files(models, [5])
    bad = models / ".model.ckpt-5.pt.commit.json"
    bad.write_text("{not json")
    run_in(write_input(tmp_path))
    assert bad.read_text() == "{not json"


@needs_torch
def test_plain_steps_after_a_plugin_run_move_the_store_pointer(tmp_path, run_in):
    """deepmd-kit alone continued a plugin run: ``latest`` follows it after adoption."""
    fill_store(tmp_path / "models", [5], "torch")
    plain_files(tmp_path / "models", [10])
    prepared = run_in(write_input(tmp_path), restart="latest")
    assert prepared.restart == str(tmp_path / "models" / "model.ckpt-10.pt")


@needs_torch
def test_a_directory_of_another_save_ckpt_is_read_with_its_own_family(tmp_path, run_in):
    """``--restart <moved store>`` under a new ``save_ckpt`` (rule 17)."""
    fill_store(tmp_path / "moved", [20], "torch")
    cfg = write_input(tmp_path, save_ckpt="run.ckpt")
    assert run_in(cfg, restart="moved").restart == str(
        tmp_path / "moved" / "model.ckpt-20.pt"
    )
