"""End to end: ``dp-ckpt`` on a store the real ``dp --pt-expt train`` wrote.

One small training is shared by the module (20 steps, a checkpoint and a
displayed learning-curve row every 5, EMA on, full validation every 5 steps
keeping the 2 best, and ``training._dp_ckpt.retention`` keeping every 10th step and the
best by ``rmse_val`` beside a window of 2). Every command runs on it; those
that change a store run on a copy. Best-validation checkpoints land in
``save_dir`` as the ``best.ckpt`` family, and ``dp --pt-expt freeze -c
best:models`` freezes the best of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from e2e_support import (
    E2E_MARKS,
    copy_tree,
    dp,
    example_config,
    make_data,
    make_workdir,
    payload_step,
    run,
    stray_files,
    unmatched_variables,
)

from dp_ckpt_plugin.commands import main

pytestmark = E2E_MARKS

RETENTION = {"keep_every_n_steps": 10, "keep_best": 1, "best_metric": "rmse_val"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The working directory of one small training with save_dir ``models``."""
    base = tmp_path_factory.mktemp("e2e_commands")
    data = make_data(base / "data_source", frames=12)
    config = example_config(
        dp_ckpt={"retention": RETENTION},
        numb_steps=20,
        save_freq=5,
        disp_freq=5,
        max_ckpt_keep=2,
        save_dir="models",
        enable_ema=True,
    )
    config["validating"] = {
        "full_validation": True,
        "validation_freq": 5,
        "full_val_start": 0.0,
        "max_best_ckpt": 2,
    }
    workdir = make_workdir(base, "main", data, config)
    result = run(dp("train", "input.json"), workdir).check()
    assert "Saved best model to" in result.output
    return workdir


def dp_ckpt_json(capsys, *args):
    status = main([*map(str, args), "--json"])
    out, _ = capsys.readouterr()
    return status, json.loads(out)


def test_ls_says_what_keeps_each_file_of_a_real_run(trained, capsys):
    status, data = dp_ckpt_json(capsys, "ls", trained / "models")
    assert status == 0 and data["format"] == "torch" and data["manifest"]
    families = {f["prefix"]: f for f in data["families"]}
    assert list(families) == ["model.ckpt", "model_ema.ckpt", "best.ckpt"]
    periodic = families["model.ckpt"]
    assert periodic["policy"] == {
        "keep_last": 2,
        **RETENTION,
        "best_mode": "min",
    }
    by = {c["step"]: c for c in periodic["checkpoints"]}
    assert sorted(by) == [10, 15, 20]
    assert all(c["kept"] for c in by.values())
    assert {"policy": "keep_every_n_steps", "reason": "every 10 steps"} in by[10][
        "kept_by"
    ]
    assert {"policy": "keep_last", "reason": "newest 2"} in by[15]["kept_by"]
    assert by[20]["kept_by"][0] == {
        "policy": "protected",
        "reason": "latest (pointer, alias)",
    }
    # every checkpoint saved at a display step records what was displayed
    for c in by.values():
        assert {"rmse_val", "rmse_trn", "rmse_e_val", "rmse_f_trn"} <= set(c["metrics"])
    best_by_rmse = min(by.values(), key=lambda c: c["metrics"]["rmse_val"])
    assert {
        "policy": "keep_best",
        "reason": "best 1 by rmse_val (lowest)",
    } in best_by_rmse["kept_by"]
    ema = families["model_ema.ckpt"]
    assert ema["policy"] == {"keep_last": 2, "keep_every_n_steps": 10}
    assert [c["step"] for c in ema["checkpoints"]] == [10, 15, 20]
    assert data["uncommitted"] == [] and data["quarantine"] == []
    assert stray_files(trained) == []


def test_best_validation_checkpoints_are_a_family_in_save_dir(trained, capsys):
    models = trained / "models"
    assert not list(trained.glob("best.ckpt-*"))  # not deepmd-kit's own place
    _, data = dp_ckpt_json(capsys, "ls", models)
    best = next(f for f in data["families"] if f["prefix"] == "best.ckpt")
    assert best["policy"] == {
        "keep_last": None,
        "keep_best": 2,
        "best_metric": "e:mae",
        "best_mode": "min",
    }
    values = {c["name"]: c["metrics"]["e:mae"] for c in best["checkpoints"]}
    lowest = min(values, key=values.get)
    # the pointer and alias of a best family name its best, not its newest
    assert best["latest"] == best["alias"] == lowest
    assert (models / "best.ckpt.pt").resolve() == models / lowest
    # deepmd-kit's validator kept its top 2 (and the newest is protected)
    assert 2 <= len(values) <= 3
    log = (trained / "val.log").read_text()
    assert log.count("\n") >= 4  # one row per validation, steps 5..20
    _, shown = dp_ckpt_json(capsys, "show", models, "best", "--digest")
    assert shown["name"] == lowest and shown["checked"] == "digest"
    assert shown["family"] == "best.ckpt"


def test_show_latest_of_a_real_run(trained, capsys):
    status, shown = dp_ckpt_json(capsys, "show", trained / "models")
    assert status == 0
    assert shown["name"] == "model.ckpt-20.pt" and shown["step"] == 20
    assert payload_step(trained / "models" / shown["name"]) == 20


def test_freeze_the_best_checkpoint(trained):
    result = run(dp("freeze", "-c", "best:models", "-o", "best_frozen"), trained)
    result.check()
    status = main(["show", str(trained / "models"), "best", "--json"])
    assert status == 0
    frozen = trained / "best_frozen.pte"
    assert frozen.exists()
    best = sorted((trained / "models").glob("best.ckpt-*.pt"))
    assert any(unmatched_variables(frozen, path) == [] for path in best)


def test_verify_and_prune_a_copy_of_a_real_run(trained, tmp_path, capsys):
    models = copy_tree(trained / "models", tmp_path / "models")
    status, data = dp_ckpt_json(capsys, "verify", models, "--digest")
    assert status == 0 and data["ok"] and len(data["checkpoints"]) >= 8
    status, data = dp_ckpt_json(
        capsys,
        "prune",
        models,
        "--family",
        "model.ckpt",
        "--keep-last",
        "1",
        "--keep-best",
        "0",
    )
    assert status == 0
    (family,) = data["families"]
    assert family["removed"] == ["model.ckpt-15.pt"]
    assert not (models / "model.ckpt-15.pt").exists()
    assert not (models / ".model.ckpt-15.pt.commit.json").exists()
    # flip a byte: only the digest sees it (not --size-only), and verify says which file
    victim = models / "model_ema.ckpt-20.pt"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    assert main(["verify", str(models), "--size-only"]) == 0
    capsys.readouterr()
    status, data = dp_ckpt_json(capsys, "verify", models, "--digest")
    assert status == 1
    assert [c["name"] for c in data["checkpoints"] if not c["ok"]] == [victim.name]


def test_the_console_entry_runs_on_a_real_run(trained):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "dp_ckpt_plugin", "ls", "models"],
        cwd=trained,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "kept by: newest 2 or every 10 steps or best 1 by rmse_val (lowest)"
        in done.stdout
    )
    assert "best.ckpt  kept by: best 2 by e:mae (lowest)" in done.stdout
