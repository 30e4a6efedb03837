"""End to end: ``dp --pt`` (deepmd-kit's main PyTorch backend) through the store (issue 12).

Every promise the pt_expt host keeps, shown with the real ``dp --pt`` on tiny
data. Runs, shared by module-scoped fixtures (a fixture that continues a run
works on a copy):

``main``
    ``dp --pt train`` with ``save_dir: models``, 20 steps, a checkpoint every
    5, window 2, EMA on.
``restarted`` / ``relocated`` / ``initialized`` / ``finetuned``
    ``--restart latest``, ``--restart <moved store>`` under another
    ``save_ckpt``, ``--init-model latest`` (archives the earlier run) and
    ``--finetune models/model.ckpt`` (a prefix).
``plain`` / ``plain_from_plugin`` / ``plugin_from_plain``
    ``DP_CKPT_DISABLE=1`` (deepmd-kit's own layout and payload) and restarts
    across, in both directions.
``two_ranks``
    ``torchrun`` with two CPU ranks (plain deepmd-kit 3.2 fails there:
    ``ProcessGroupNCCL is only supported with GPUs``).
``multitask`` / ``multitask_plain`` / ``multitask_restarted``
    ``examples/multitask.json`` (``model_dict``), its payload compared with
    deepmd-kit's own, restarted with ``latest`` and frozen per head.

deepmd-kit's ``dp --pt`` records ``train_infos.step`` as the index of the last
step (19 in ``model.ckpt-20.pt``) and a restart runs that step again; the
plugin records the steps done (20), so a restart starts at the next step.

Run with ``pytest tests/test_e2e_pt.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    ENERGY_RMSE,
    EXAMPLES,
    SAVE_LINE,
    TIMINGS,
    TORCHRUN,
    Result,
    assert_committed,
    assert_no_traceback,
    copy_tree,
    dp,
    dp_env,
    example_config,
    load_payload,
    lock_files,
    make_data,
    make_workdir,
    payload_step,
    payload_structure,
    rank_logs,
    read_pointer,
    records_in,
    resumed_from,
    run,
    saved_steps,
    signal_group,
    start,
    steps,
    stray_files,
    torchrun,
    tree_state,
    wait_for,
    write_config,
)

pytestmark = E2E_MARKS

TRAINING = {
    "numb_steps": 20,
    "save_freq": 5,
    "max_ckpt_keep": 2,
    "save_dir": "models",
    "enable_ema": True,
}
BATCH = re.compile(r"Batch\s+(\d+):")
STARTUP = "(dp --pt): save_dir models, keep the newest 2, verify digest"
FAST = 30.0


def pt(*args):
    """``dp --pt <args>``."""
    return dp(*args, backend="pt")


def config(**changes):
    dp_ckpt = changes.pop("dp_ckpt", None)
    return example_config(dp_ckpt=dp_ckpt, **{**TRAINING, **changes})


def pt_step(path: Path) -> int:
    """The steps done of a ``dp --pt`` checkpoint.

    Plain deepmd-kit records the last step's index (one less); the plugin,
    whose payload has its ``_dp_ckpt`` entry, the steps done.
    """
    return payload_step(path) + (0 if "_dp_ckpt" in load_payload(path) else 1)


def batches(text: str) -> list[int]:
    return sorted({int(s) for s in BATCH.findall(text)})


@dataclass
class Run:
    workdir: Path
    result: Result

    @property
    def models(self) -> Path:
        return self.workdir / "models"


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_pt")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=8)


@pytest.fixture(scope="module")
def main_run(base, data) -> Run:
    workdir = make_workdir(base, "main", data, config())
    return Run(workdir, run(pt("train", "input.json"), workdir).check())


@pytest.fixture(scope="module")
def restarted(base, main_run) -> Run:
    workdir = copy_tree(main_run.workdir, base / "restarted")
    write_config(workdir / "input.json", config(numb_steps=30))
    result = run(pt("train", "input.json", "--restart", "latest"), workdir)
    return Run(workdir, result.check())


@pytest.fixture(scope="module")
def plain(base, data) -> Run:
    workdir = make_workdir(base, "plain", data, config())
    result = run(
        pt("train", "input.json"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt train input.json",
    )
    return Run(workdir, result.check())


# -- layout, commits, retention, logs -------------------------------------------------


def test_layout_records_retention_and_logs(main_run):
    models, cwd, out = main_run.models, main_run.workdir, main_run.result.output
    assert_no_traceback(main_run.result)
    assert steps(models, "model.ckpt") == [15, 20]
    assert steps(models, "model_ema.ckpt") == [15, 20]
    for family in ("model.ckpt", "model_ema.ckpt"):
        for step in (15, 20):
            assert_committed(models / f"{family}-{step}.pt", step=step, family=family)
    assert records_in(models) == sorted(
        f"{f}-{s}.pt" for f in ("model.ckpt", "model_ema.ckpt") for s in (15, 20)
    )
    # self-contained: pointer and aliases inside, relative; deepmd-kit's outside
    assert read_pointer(models / "checkpoint") == "model.ckpt-20.pt"
    assert read_pointer(models / "checkpoint.model_ema.ckpt") == "model_ema.ckpt-20.pt"
    assert os.readlink(models / "model.ckpt.pt") == "model.ckpt-20.pt"
    assert read_pointer(cwd / "checkpoint") == "models/model.ckpt-20.pt"
    assert (cwd / "model.ckpt.pt").resolve() == (models / "model.ckpt-20.pt").resolve()
    assert pt_step(models / "model.ckpt-20.pt") == 20
    assert stray_files(cwd) == []
    assert lock_files(cwd) == []
    # the same lines as the pt_expt host
    assert out.count(STARTUP) == 1
    assert saved_steps(out) == [(f"model.ckpt-{s}.pt", s) for s in (5, 10, 15, 20)]
    for line in out.splitlines():
        if "saved step" in line:
            assert SAVE_LINE.search(line), line
    # deepmd-kit's own lines stay, as it spells them (issue 36)
    assert out.count("Saved model to models/model.ckpt-") == 4
    assert "Trained model has been saved to: model.ckpt" in out
    assert "training ended; the latest checkpoint is models/model.ckpt-20.pt" in out


def test_payload_is_deepmds(main_run, plain):
    for name in ("model.ckpt-20.pt", "model_ema.ckpt-20.pt"):
        assert payload_structure(main_run.models / name) == payload_structure(
            plain.models / name
        ), name
    assert payload_structure(main_run.models / "model.ckpt-20.pt")["top"] == [
        "ema",
        "model",
        "optimizer",
    ]
    assert pt_step(main_run.models / "model.ckpt-20.pt") == pt_step(
        plain.models / "model.ckpt-20.pt"
    )


# -- restarts ---------------------------------------------------------------------------


def test_restart_latest(restarted):
    models, out = restarted.models, restarted.result.output
    assert (
        "--restart latest: models/model.ckpt-20.pt (step 20), through the pointer "
        "models/checkpoint; size and digest match its commit record"
    ) in out
    assert resumed_from(out, restarted.workdir) == [
        (models / "model.ckpt-20.pt").resolve()
    ]
    # the checkpoint records the steps done: the restart starts at step 21
    assert min(batches(out)) > 20
    # numb_steps 20 -> 30: the schedule follows it, so the resume says it is
    # not exact, and why (the batches and generators are still restored)
    assert (
        "resume at step 20 is not exact: training.numb_steps 20 -> 30, the "
        "learning-rate schedule and loss prefactors follow numb_steps; the batches "
        "and random generators are restored"
    ) in out
    assert "exact resume at step 20" not in out
    assert steps(models, "model.ckpt") == [25, 30]
    assert pt_step(models / "model.ckpt-30.pt") == 30
    assert_committed(models / "model.ckpt-30.pt", step=30, family="model.ckpt")
    assert read_pointer(models / "checkpoint") == "model.ckpt-30.pt"
    assert lock_files(restarted.workdir) == []


def test_moved_store_under_another_save_ckpt_then_freeze_and_test(base, data, main_run):
    moved = copy_tree(main_run.models, base / "elsewhere" / "moved_store")
    before = tree_state(moved)
    workdir = make_workdir(
        base, "relocated", data, config(numb_steps=25, save_ckpt="run.ckpt")
    )
    spec = os.path.relpath(moved, workdir)
    result = run(pt("train", "input.json", "--restart", spec), workdir).check()
    assert resumed_from(result.output, workdir) == [
        (moved / "model.ckpt-20.pt").resolve()
    ]
    assert steps(workdir / "models", "run.ckpt") == [25]
    assert_committed(workdir / "models" / "run.ckpt-25.pt", step=25, family="run.ckpt")
    assert tree_state(moved) == before
    frozen = run(pt("freeze", "-c", "models", "-o", "frozen"), workdir).check()
    assert "freezing models/run.ckpt-25.pt, through the pointer models/checkpoint" in (
        frozen.output
    )
    assert (workdir / "frozen.pth").is_file()
    tested = run(pt("test", "-m", "frozen.pth", "-s", "data/valid"), workdir).check()
    rmse = [float(x) for x in ENERGY_RMSE.findall(tested.output)]
    assert rmse and all(math.isfinite(x) for x in rmse), tested.describe()


def test_init_model_latest_archives_the_earlier_run(base, main_run):
    workdir = copy_tree(main_run.workdir, base / "initialized")
    write_config(workdir / "input.json", config(numb_steps=10))
    result = run(pt("train", "input.json", "--init-model", "latest"), workdir).check()
    out = result.output
    assert "--init-model latest: models/model.ckpt-20.pt (step 20)" in out
    assert "archived 4 checkpoint(s) of an earlier run (steps 15, 20)" in out
    (archive,) = (workdir / "models" / "archive").iterdir()
    assert_committed(archive / "model.ckpt-20.pt", step=20, family="model.ckpt")
    assert steps(workdir / "models", "model.ckpt") == [5, 10]
    assert min(batches(out)) == 1


def test_finetune_takes_a_prefix(base, main_run):
    workdir = copy_tree(main_run.workdir, base / "finetuned")
    write_config(workdir / "input.json", config(numb_steps=5, save_freq=5))
    result = run(
        pt("train", "input.json", "--finetune", "models/model.ckpt"), workdir
    ).check()
    assert (
        "--finetune models/model.ckpt: models/model.ckpt-20.pt (step 20), through the "
        "alias models/model.ckpt.pt"
    ) in result.output
    assert steps(workdir / "models", "model.ckpt") == [5]


def test_mistakes_fail_fast(base, data):
    workdir = make_workdir(base, "bad", data, config())
    for args, expected in (
        (["--restart", "nowhere"], "no checkpoint found"),
        (["--finetune", "models"], "no checkpoint found"),
    ):
        result = run(pt("train", "input.json", *args), workdir, timeout=120)
        assert result.returncode == 1, result.describe()
        assert_no_traceback(result)
        assert expected in result.output
        assert "Summary of DataSystem" not in result.output
        assert result.seconds < FAST
        assert not (workdir / "models").exists()


def test_second_writer_is_refused(base, data):
    from dp_ckpt_plugin.store.lock import StoreLock

    workdir = make_workdir(base, "locked", data, config())
    (workdir / "models").mkdir()
    with StoreLock(workdir / "models"):
        result = run(pt("train", "input.json"), workdir, timeout=120)
    assert result.returncode == 1, result.describe()
    assert f"pid {os.getpid()}" in result.output
    assert result.seconds < FAST


# -- interchangeable with plain deepmd-kit, and the off switch ------------------------


def test_off_switch_gives_deepmds_layout(plain):
    models, cwd, out = plain.models, plain.workdir, plain.result.output
    assert "_dp_ckpt" in (cwd / "input.json").read_text()
    assert steps(models, "model.ckpt") == [15, 20]
    assert records_in(models) == []
    assert not (models / "checkpoint").exists()
    assert read_pointer(cwd / "checkpoint") == "models/model.ckpt-20.pt"
    assert "dp_ckpt_plugin" not in out
    assert lock_files(cwd) == []


def test_plugin_checkpoint_restarts_under_plain_deepmd(base, main_run):
    workdir = copy_tree(main_run.workdir, base / "plain_from_plugin")
    write_config(workdir / "input.json", config(numb_steps=25))
    result = run(
        pt("train", "input.json", "--restart", "models/model.ckpt-20.pt"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt train --restart models/model.ckpt-20.pt",
    ).check()
    assert resumed_from(result.output, workdir) == [
        (workdir / "models" / "model.ckpt-20.pt").resolve()
    ]
    assert pt_step(workdir / "models" / "model.ckpt-25.pt") == 25


def test_plain_save_dir_is_adopted(base, plain):
    workdir = copy_tree(plain.workdir, base / "plugin_from_plain")
    write_config(workdir / "input.json", config(numb_steps=25))
    result = run(pt("train", "input.json", "--restart", "models"), workdir).check()
    out = result.output
    assert "adopted 4 checkpoint(s) that plain deepmd-kit wrote in models" in out
    assert "--restart models: models/model.ckpt-20.pt (step 20)" in out
    models = workdir / "models"
    assert steps(models, "model.ckpt") == [20, 25]
    assert_committed(models / "model.ckpt-20.pt", step=20, family="model.ckpt")
    assert_committed(models / "model.ckpt-25.pt", step=25, family="model.ckpt")


# -- two ranks on CPU ---------------------------------------------------------------------


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun at {TORCHRUN}")
def test_two_cpu_ranks(base, data):
    """Two gloo ranks, background saves: one writer, every save committed."""
    workdir = make_workdir(
        base,
        "two_ranks",
        data,
        config(numb_steps=10, save_ckpt="run.ckpt", dp_ckpt={"async_save": True}),
    )
    logs = workdir / "torchrun_logs"
    result = run(
        torchrun(2, logs, "train", "input.json", backend="pt"), workdir
    ).check()
    by_rank = rank_logs(logs)
    assert sorted(by_rank) == [0, 1], result.describe()
    models = workdir / "models"
    assert steps(models, "run.ckpt") == [5, 10]
    for step in (5, 10):
        assert_committed(models / f"run.ckpt-{step}.pt", step=step, family="run.ckpt")
    assert saved_steps(by_rank[0]) == [("run.ckpt-5.pt", 5), ("run.ckpt-10.pt", 10)]
    assert "in the background (training paused" in by_rank[0]
    assert saved_steps(by_rank[1]) == []
    assert "Rank: 1/2" in by_rank[1]
    assert read_pointer(models / "checkpoint") == "run.ckpt-10.pt"
    assert lock_files(workdir) == []
    assert stray_files(workdir) == []


# -- a stop signal ----------------------------------------------------------------------


def test_sigterm_stops_with_a_checkpoint_and_restart_continues(base, data):
    """SIGTERM to the whole process group (Slurm, ``kill -TERM -<pgid>``): it also
    reaches deepmd-kit's DataLoader workers, which leave it to the trainer."""
    workdir = make_workdir(
        base,
        "preempted",
        data,
        config(numb_steps=2000, save_freq=1000, disp_freq=1),
    )
    log = workdir / "train.log"
    began = time.monotonic()
    proc = start(pt("train", "input.json"), workdir, log, session=True)
    try:
        wait_for(log, r"Batch\s+3:", proc)
        signal_group(proc, signal.SIGTERM)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(("dp --pt train (SIGTERM)", time.monotonic() - began))
    out = log.read_text()
    assert status == 143, out[-3000:]
    (stopped,) = re.findall(r"SIGTERM: stopped after step (\d+);", out)
    stopped = int(stopped)
    models = workdir / "models"
    assert_committed(
        models / f"model.ckpt-{stopped}.pt", step=stopped, family="model.ckpt"
    )
    assert pt_step(models / f"model.ckpt-{stopped}.pt") == stopped
    assert lock_files(workdir) == []
    write_config(
        workdir / "input.json",
        config(numb_steps=stopped + 2, save_freq=1000, disp_freq=1),
    )
    cont = run(
        pt("train", "input.json", "--restart", "latest", "--skip-neighbor-stat"),
        workdir,
    ).check()
    assert resumed_from(cont.output, workdir) == [
        (models / f"model.ckpt-{stopped}.pt").resolve()
    ]
    assert pt_step(models / f"model.ckpt-{stopped + 2}.pt") == stopped + 2


def test_change_bias_latest(main_run, base):
    workdir = copy_tree(main_run.workdir, base / "change_bias")
    result = run(pt("change-bias", "latest", "-s", "data/valid"), workdir).check()
    assert "change-bias latest: models/model.ckpt-20.pt" in result.output
    assert (workdir / "model.ckpt-20_updated.pt").is_file()


# -- multi-task -----------------------------------------------------------------------------


def multitask_config(**training):
    config = json.loads((EXAMPLES / "multitask.json").read_text())
    config["training"].update(training)
    return config


@pytest.fixture(scope="module")
def multitask(base, data) -> Run:
    workdir = make_workdir(base, "multitask", data, multitask_config(numb_steps=10))
    return Run(workdir, run(pt("train", "input.json"), workdir).check())


@pytest.fixture(scope="module")
def multitask_plain(base, data) -> Run:
    workdir = make_workdir(
        base, "multitask_plain", data, multitask_config(numb_steps=10)
    )
    result = run(
        pt("train", "input.json"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt train multitask",
    )
    return Run(workdir, result.check())


def test_multitask_payload_is_deepmds(multitask, multitask_plain):
    ours = multitask.models / "model.ckpt-10.pt"
    theirs = multitask_plain.models / "model.ckpt-10.pt"
    assert_committed(ours, step=10, family="model.ckpt")
    assert payload_structure(ours) == payload_structure(theirs)
    model = load_payload(ours)["model"]
    assert any(k.startswith("model.head_a.") for k in model)
    assert any(k.startswith("model.head_b.") for k in model)
    params = model["_extra_state"]["model_params"]
    assert sorted(params["model_dict"]) == ["head_a", "head_b"]
    assert saved_steps(multitask.result.output) == [
        ("model.ckpt-5.pt", 5),
        ("model.ckpt-10.pt", 10),
    ]


def test_multitask_restarts_and_freezes_a_head(base, multitask):
    workdir = copy_tree(multitask.workdir, base / "multitask_restarted")
    write_config(workdir / "input.json", multitask_config(numb_steps=15))
    result = run(pt("train", "input.json", "--restart", "latest"), workdir).check()
    models = workdir / "models"
    assert resumed_from(result.output, workdir) == [
        (models / "model.ckpt-10.pt").resolve()
    ]
    assert steps(models, "model.ckpt") == [10, 15]
    assert_committed(models / "model.ckpt-15.pt", step=15, family="model.ckpt")
    assert pt_step(models / "model.ckpt-15.pt") == 15
    frozen = run(
        pt("freeze", "-c", "models", "--head", "head_b", "-o", "head_b"), workdir
    ).check()
    assert "freezing models/model.ckpt-15.pt" in frozen.output
    assert (workdir / "head_b.pth").is_file()
    headless = run(pt("freeze", "-c", "models", "-o", "which"), workdir)
    assert headless.returncode == 1, headless.describe()
    assert_no_traceback(headless)
    assert (
        "models/model.ckpt-15.pt is a multi-task checkpoint with the heads head_a, "
        "head_b: say which to freeze with --head"
    ) in headless.output
    shutil.rmtree(workdir / "data")
