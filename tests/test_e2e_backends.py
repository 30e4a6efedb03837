"""End to end: issue 20 on both backends, with the real ``dp`` on tiny data.

One module for what a workflow meets beyond the basics (the sharded runs are
in ``test_e2e_sharded.py``, what plain deepmd-kit reads in
``test_e2e_interop.py``):

``dp --pt`` metrics and best files
    periodic checkpoints record the displayed learning curve and
    ``keep_best`` ranks them; ``validating.full_validation`` writes the
    ``best.ckpt`` family into ``save_dir``; ``keep_best`` that nothing would
    feed is refused before training.
Ctrl-C
    one Ctrl-C to the process group commits the steps done and ``dp`` dies
    by ``SIGINT`` (a calling script stops too); a second one aborts at once;
    ``dp --pt``'s data-loading workers survive the signal.
fallback
    ``freeze`` and ``change-bias`` refuse an older checkpoint in place of a
    corrupt newest one, unless it is named or allowed.
archives
    the start-up line says what is archived, ``max_archives`` caps it,
    ``dp-ckpt ls`` shows the sizes and ``dp-ckpt prune --archives`` removes.
handles
    ``--restart lastest`` gets "did you mean latest?"; ``dp-ckpt resolve
    --path`` prints the path alone.
output
    ``dp-ckpt ls`` of a run without EMA, of a checkpoint cut short;
    ``dp-ckpt inspect`` of a real checkpoint counts each storage once.
multi-task under ``dp --pt-expt``
    train, restart, freeze one head; without ``--head``, one line naming
    the heads.

Run with ``pytest tests/test_e2e_backends.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from e2e_support import (
    DP,
    E2E_MARKS,
    EXAMPLES,
    TIMINGS,
    assert_committed,
    assert_no_traceback,
    copy_tree,
    dp,
    dp_env,
    example_config,
    lock_files,
    make_data,
    make_workdir,
    record_of,
    resumed_from,
    run,
    signal_group,
    start,
    steps,
    stray_files,
    unmatched_variables,
    wait_for,
    write_config,
)

from dp_ckpt_plugin.commands import main as dp_ckpt

pytestmark = E2E_MARKS

FAST = 30.0
TINY = {"numb_steps": 6, "save_freq": 2, "disp_freq": 2, "max_ckpt_keep": 1}
LONG = {"numb_steps": 3000, "save_freq": 1000, "disp_freq": 1}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_backends")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=6)


def json_of(capsys, *args) -> tuple[int, dict]:
    status = dp_ckpt([*map(str, args), "--json"])
    out, _ = capsys.readouterr()
    return status, json.loads(out)


# -- dp --pt: metrics, keep_best, best-validation checkpoints ------------------------


@pytest.fixture(scope="module")
def pt_best(base, data) -> Path:
    """``dp --pt`` with keep_best by rmse_val and full validation keeping the best 1."""
    config = example_config(
        dp_ckpt={"retention": {"keep_best": 1, "best_metric": "rmse_val"}},
        **{**TINY, "max_ckpt_keep": 2},
    )
    config["validating"] = {
        "full_validation": True,
        "validation_freq": 2,
        "full_val_start": 0.0,
        "max_best_ckpt": 1,
    }
    workdir = make_workdir(base, "pt_best", data, config)
    result = run(dp("train", "input.json", backend="pt"), workdir).check()
    assert "Saved best model to models/best.ckpt-" in result.output
    return workdir


def test_pt_records_the_displayed_metrics_and_keeps_the_best(pt_best):
    models = pt_best / "models"
    lcurve = {}
    for line in (pt_best / "lcurve.out").read_text().splitlines():
        if not line.startswith("#"):
            fields = line.split()
            lcurve[int(fields[0])] = float(fields[1])  # rmse_val
    kept = steps(models, "model.ckpt")
    best = min(lcurve[s] for s in (2, 4, 6))
    assert kept == sorted({4, 6, *(s for s in (2, 4, 6) if lcurve[s] == best)})
    for step in kept:
        metrics = record_of(models / f"model.ckpt-{step}.pt")["metrics"]
        assert metrics["rmse_val"] == pytest.approx(lcurve[step], rel=1e-2)
        assert {"rmse_trn", "rmse_e_val", "rmse_f_trn"} <= set(metrics)


def test_pt_best_validation_checkpoints_are_a_family_of_save_dir(pt_best, capsys):
    models = pt_best / "models"
    (best,) = steps(models, "best.ckpt")
    assert_committed(models / f"best.ckpt-{best}.pt", step=best, family="best.ckpt")
    assert (models / "checkpoint.best.ckpt").read_text() == f"best.ckpt-{best}.pt"
    assert list(pt_best.glob("best.ckpt-*.t-*.pt")) == []  # not deepmd-kit's files
    assert list(models.glob("best.ckpt-*.t-*.pt")) == []
    (metric,) = record_of(models / f"best.ckpt-{best}.pt")["metrics"]
    assert ":" in metric  # validating.validation_metric, such as e:mae
    status = dp_ckpt(["resolve", "best", "--dir", str(models), "--path"])
    assert status == 0
    assert capsys.readouterr().out == f"{models / f'best.ckpt-{best}.pt'}\n"
    frozen = run(dp("freeze", "-c", "best:models", "-o", "best", backend="pt"), pt_best)
    assert f"freezing models/best.ckpt-{best}.pt" in frozen.check().output
    assert (pt_best / "best.pth").is_file()


@pytest.mark.parametrize("backend", ["pt", "pt-expt"])
def test_keep_best_that_nothing_feeds_is_refused_before_training(base, data, backend):
    config = example_config(
        dp_ckpt={"retention": {"keep_best": 2}}, disp_training=False, **TINY
    )
    workdir = make_workdir(base, f"no_metrics_{backend}", data, config)
    result = run(dp("train", "input.json", backend=backend), workdir, timeout=120)
    assert result.returncode == 1, result.describe()
    assert_no_traceback(result)
    assert "`training/_dp_ckpt/retention/keep_best`" in result.output
    assert "training.disp_training is false" in result.output
    assert result.seconds < FAST
    assert not (workdir / "models").exists()


# -- Ctrl-C ------------------------------------------------------------------------------

STOPPED = re.compile(r"SIGINT: stopped after step (\d+); (\S+) is committed;")


def interrupted(base, data, name, command, backend, *, times=1):
    """Start ``command`` as a terminal's foreground job; Ctrl-C it ``times`` times.

    The second Ctrl-C comes 20 ms after the first: after Python has run the
    first one's handler (signals sent closer together may reach it as one),
    and before a stop of this tiny model would be done.
    """
    workdir = make_workdir(base, name, data, example_config(**LONG))
    log = workdir / "train.log"
    began = time.monotonic()
    proc = start(command, workdir, log, session=True)
    try:
        wait_for(log, r"Batch\s+3:", proc)
        for i in range(times):
            if i:
                time.sleep(0.02)
            signal_group(proc, signal.SIGINT)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(
        (f"dp --{backend} train ({times} x Ctrl-C)", time.monotonic() - began)
    )
    return workdir, status, log.read_text("utf-8", "replace")


@pytest.mark.parametrize("backend", ["pt", "pt-expt"])
def test_ctrl_c_commits_the_steps_done_and_the_calling_script_stops(
    base, data, backend
):
    script = f"{DP} --{backend} train input.json; echo the script went on"
    workdir, status, out = interrupted(
        base, data, f"ctrl_c_{backend}", ["bash", "-c", script], backend
    )
    assert status == -signal.SIGINT, out[-3000:]  # bash died of SIGINT too
    assert "the script went on" not in out
    assert "Traceback" not in out
    ((step, path),) = STOPPED.findall(out)
    step = int(step)
    assert "continue with --restart latest (exit status 130)" in out
    assert_committed(workdir / path, step=step, family="model.ckpt")
    assert (workdir / "models" / "checkpoint").read_text() == f"model.ckpt-{step}.pt"
    assert lock_files(workdir) == []
    assert stray_files(workdir) == []


def test_a_second_ctrl_c_aborts_at_once(base, data):
    """Two Ctrl-C: the run aborts, dies by SIGINT, leaves nothing half-written.

    Whether the second one comes before the first one's stop is done is a race
    a tiny model can lose (the stop takes some 50 ms); it is run up to three
    times, and must abort at least once.
    """
    outcomes = []
    for attempt in range(3):
        workdir, status, out = interrupted(
            base,
            data,
            f"ctrl_c_twice_{attempt}",
            dp("train", "input.json", backend="pt"),
            "pt",
            times=2,
        )
        assert status == -signal.SIGINT, out[-3000:]
        assert "Traceback" not in out
        assert "DataLoader worker" not in out
        assert lock_files(workdir) == []
        assert [p for p in stray_files(workdir) if ".tmp-" not in p.name] == []
        aborted = (
            "SIGINT: aborted; the steps since the last committed checkpoint" in out
        )
        outcomes.append(aborted)
        if aborted:
            break
    assert any(outcomes), "the second Ctrl-C never came before the stop was done"


@pytest.mark.parametrize("backend", ["pt", "pt-expt"])
def test_stop_signals_are_ignored_to_the_very_end(base, data, backend):
    """SIGTERM until the stop began, then SIGTERM and SIGUSR1 every 3 ms until
    the process has ended: the stop commits, and ``dp`` exits 143 by itself,
    never by a later signal, however far into the interpreter's shutdown one
    comes. (Two signals pending at once are handled in the order of their
    numbers, SIGUSR1 first: the storm of both starts once SIGTERM is the
    first the process took.)"""
    workdir = make_workdir(base, f"storm_{backend}", data, example_config(**LONG))
    log = workdir / "train.log"
    began = time.monotonic()
    proc = start(dp("train", "input.json", backend=backend), workdir, log)
    sent = 0
    try:
        wait_for(log, r"Batch\s+3:", proc)
        began_stop, stormed = False, 0
        while proc.poll() is None:
            if not began_stop:
                began_stop = "SIGTERM: stopping" in log.read_text("utf-8", "replace")
            both = (signal.SIGTERM, signal.SIGUSR1)[sent % 2]
            try:
                os.kill(proc.pid, both if began_stop else signal.SIGTERM)
            except ProcessLookupError:
                break
            sent += 1
            stormed += began_stop
            time.sleep(0.003)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(
        (f"dp --{backend} train (a storm of signals)", time.monotonic() - began)
    )
    out = log.read_text("utf-8", "replace")
    assert status == 128 + signal.SIGTERM, out[-3000:]  # not -15 nor -10: by itself
    assert stormed > 20, "the signals did not span the stop"
    assert "Traceback" not in out
    found = re.search(
        r"SIGTERM: stopped after step (\d+); (\S+) is committed;.*\(exit status 143\)",
        out,
    )
    assert found, out[-3000:]
    assert_committed(
        workdir / found.group(2), step=int(found.group(1)), family="model.ckpt"
    )
    assert lock_files(workdir) == []


# -- freeze and change-bias never fall back silently ---------------------------------------


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_freeze_and_change_bias_refuse_an_older_checkpoint(base, pt_best):
    workdir = copy_tree(pt_best, base / "fallback_pt")
    models = workdir / "models"
    older, newest = steps(models, "model.ckpt")[-2:]
    corrupt(models / f"model.ckpt-{newest}.pt")
    for args in (
        ["freeze", "-c", "models", "-o", "f"],
        ["change-bias", "models", "-s", "data/valid"],
    ):
        result = run(dp(*args, backend="pt"), workdir, timeout=120)
        assert result.returncode == 1, result.describe()
        assert_no_traceback(result)
        assert (
            f"the plugin does not put the older models/model.ckpt-{older}.pt "
            f"(step {older}) in its place without being asked"
        ) in result.output
    assert not (workdir / "f.pth").exists()
    allowed = run(
        dp("freeze", "-c", "models", "-o", "f", backend="pt"),
        workdir,
        env=dp_env(DP_CKPT_ALLOW_FALLBACK="1"),
    ).check()
    assert f"using the older models/model.ckpt-{older}.pt" in allowed.output
    assert (workdir / "f.pth").is_file()


# -- archives ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def archived(base, data):
    """Three fresh runs in one save_dir (each archives the one before), the
    third with ``max_archives: 1``."""
    config = example_config(numb_steps=2, save_freq=2, disp_freq=2)
    workdir = make_workdir(base, "archives", data, config)
    for _ in range(2):
        run(dp("train", "input.json"), workdir).check()
    capped = example_config(numb_steps=2, save_freq=2, disp_freq=2)
    capped["training"]["_dp_ckpt"]["max_archives"] = 1
    write_config(workdir / "input.json", capped)
    return workdir, run(dp("train", "input.json"), workdir).check()


def test_archives_are_counted_capped_listed_and_pruned(archived, capsys):
    workdir, third = archived
    archive = workdir / "models" / "archive"
    assert re.search(
        r"async_save off, archive: 1 earlier run\(s\), [0-9.]+ kB \(keep the newest 1\)",
        third.output,
    )
    assert "removed 1 archive(s) of earlier runs beyond the newest 1" in third.output
    (left,) = sorted(archive.iterdir())  # the second run's, not the first's
    assert (left / "model.ckpt-2.pt").is_file()
    status, listing = json_of(capsys, "ls", workdir / "models")
    size = sum(p.lstat().st_size for p in left.iterdir() if not p.is_symlink())
    assert status == 0 and listing["archive_size"] == size
    status, pruned = json_of(
        capsys, "prune", workdir / "models", "--archives", "--keep-archives", "0"
    )
    assert status == 0 and pruned["archives"]["removed"] == [left.name]
    assert list(archive.iterdir()) == []


# -- handles ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "args", "close"),
    [
        ("pt-expt", ["train", "input.json", "--restart", "lastest"], "latest"),
        ("pt", ["freeze", "-c", "modles"], "models"),
    ],
)
def test_a_mistyped_handle_gets_a_suggestion(pt_best, backend, args, close):
    result = run(dp(*args, backend=backend), pt_best, timeout=120)
    assert result.returncode == 1, result.describe()
    assert_no_traceback(result)
    assert f"(did you mean {close}?)" in result.output
    assert result.seconds < FAST


def test_resolve_path_of_a_real_store_is_the_path_alone(pt_best, capsys):
    models = pt_best / "models"
    status = dp_ckpt(["resolve", "latest", "--dir", str(models), "--path"])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    assert out == f"{models / 'model.ckpt-6.pt'}\n"


# -- what dp-ckpt shows of a real store ------------------------------------------------------


def test_ls_and_inspect_of_a_real_store(base, pt_best, capsys):
    models = pt_best / "models"
    status = dp_ckpt(["ls", str(models)])
    out, _ = capsys.readouterr()
    assert status == 0
    (ema,) = [line for line in out.splitlines() if line.startswith("model_ema.ckpt")]
    assert ema.endswith(": no committed checkpoints")  # EMA is off
    newest = models / "model.ckpt-6.pt"
    status, inspected = json_of(capsys, "inspect", newest)
    assert status == 0
    assert inspected["payload_bytes"] <= newest.stat().st_size
    copy = copy_tree(models, base / "cut_short")
    with open(copy / "model.ckpt-6.pt", "r+b") as handle:
        handle.truncate(999)
    status = dp_ckpt(["ls", str(copy)])
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if " model.ckpt-6.pt " in line]
    assert "999 B of" in row and "CUT SHORT" in row


# -- multi-task under dp --pt-expt -------------------------------------------------------------


@pytest.fixture(scope="module")
def multitask(base, data):
    config = json.loads((EXAMPLES / "multitask.json").read_text())
    config["training"].update(numb_steps=4, save_freq=2, disp_freq=2)
    config["training"]["_dp_ckpt"] = {
        "retention": {"keep_best": 1, "best_metric": "rmse_val_head_a"}
    }
    workdir = make_workdir(base, "multitask_expt", data, config)
    result = run(dp("train", "input.json"), workdir).check()
    return workdir, config, result


def test_multitask_trains_with_metrics_per_head(multitask):
    workdir, _, _ = multitask
    metrics = record_of(workdir / "models" / "model.ckpt-4.pt")["metrics"]
    assert {"rmse_val_head_a", "rmse_val_head_b", "rmse_trn_head_a"} <= set(metrics)


def test_multitask_restarts_and_freezes_one_head(base, multitask):
    source, config, _ = multitask
    workdir = copy_tree(source, base / "multitask_expt_restarted")
    config["training"]["numb_steps"] = 6
    write_config(workdir / "input.json", config)
    result = run(dp("train", "input.json", "--restart", "latest"), workdir).check()
    models = workdir / "models"
    assert resumed_from(result.output, workdir) == [
        (models / "model.ckpt-4.pt").resolve()
    ]
    assert_committed(models / "model.ckpt-6.pt", step=6, family="model.ckpt")
    headless = run(dp("freeze", "-c", "models", "-o", "which"), workdir)
    assert headless.returncode == 1, headless.describe()
    assert_no_traceback(headless)
    assert (
        "models/model.ckpt-6.pt is a multi-task checkpoint with the heads head_a, "
        "head_b: say which to freeze with --head (such as dp --pt-expt freeze -c "
        "models --head head_a)"
    ) in headless.output
    frozen = run(
        dp("freeze", "-c", "models", "--head", "head_b", "-o", "head_b"), workdir
    ).check()
    assert "freezing models/model.ckpt-6.pt" in frozen.output
    assert (workdir / "head_b.pte").is_file()
    assert unmatched_variables(workdir / "head_b.pte", models / "model.ckpt-6.pt") == []
    assert not os.path.exists(workdir / "which.pte")
    # a corrupt newest checkpoint: refused, not replaced by the older one
    corrupt(models / "model.ckpt-6.pt")
    refused = run(dp("freeze", "-c", "models", "--head", "head_a"), workdir)
    assert refused.returncode == 1, refused.describe()
    assert "does not put the older models/model.ckpt-4.pt (step 4)" in refused.output
