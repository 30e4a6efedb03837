"""End to end: the plugin fits deepmd-kit like a native feature (issue 9).

Real ``dp --pt-expt`` runs on tiny data, each showing one item of the issue
(``test_e2e.py`` shows the others on its shared runs: the off switch with
``training._dp_ckpt``, the logs, adoption, bad input, normalized paths):

- item 1: the top-level ``dp_ckpt`` of 0.2 is refused in one line naming
  ``training._dp_ckpt``;
- item 2: on another deepmd-kit version the plugin says so in one line and
  deepmd-kit runs alone, creating none of the plugin's files;
- item 3: ``--finetune`` and ``change-bias`` take ``latest``, a directory and
  a prefix;
- item 4: a real signal to a real ``dp`` (and to ``torchrun``) stops training
  after a step with a committed checkpoint, exit status 128 + signal, a
  second signal changes nothing, and ``--restart latest`` continues;
- item 6: without ``save_dir`` a restart from the plugin's own files does not
  claim they were written without it.

Run with ``pytest tests/test_e2e_native.py -s`` to see the wall time of each
command.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from e2e_support import (
    E2E_MARKS,
    TIMINGS,
    TORCHRUN,
    assert_committed,
    assert_no_traceback,
    copy_tree,
    dp,
    dp_as_version,
    example_config,
    lock_files,
    make_data,
    make_workdir,
    payload_step,
    rank_logs,
    read_pointer,
    records_in,
    resumed_from,
    run,
    saved_steps,
    shared_config,
    start,
    steps,
    stray_files,
    torchrun,
    tree_state,
    wait_for,
    write_config,
)

pytestmark = E2E_MARKS

TRAINING = {"numb_steps": 10, "save_freq": 5, "max_ckpt_keep": 2, "save_dir": "models"}
"""The ``training`` keys of the short runs, on top of ``examples/input.json``."""

LONG = {"numb_steps": 2000, "save_freq": 1000, "disp_freq": 1}
"""A run that is still training when the signal comes."""

BATCH = re.compile(r"Batch\s+(\d+):")
STOPPED = re.compile(r"(SIG\w+): stopped after step (\d+);")


def config(**changes):
    """:data:`TRAINING` on top of the example input, with ``changes``."""
    dp_ckpt = changes.pop("dp_ckpt", None)
    return example_config(dp_ckpt=dp_ckpt, **{**TRAINING, **changes})


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_native")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=8)


@pytest.fixture
def trained(trained_copy):
    """A copy of the run's shared ``dp --pt-expt`` training (``conftest.py``):
    10 steps with ``save_dir: models``, ``models/model.ckpt-{5,10}.pt``, the
    input :func:`config` gives."""
    assert shared_config() == config()
    return trained_copy("pt-expt")


# -- item 2: the version guard ---------------------------------------------------


def test_another_deepmd_version_leaves_deepmd_alone(base, data):
    """On deepmd-kit "3.1.3" the plugin says so once and registers nothing."""
    workdir = make_workdir(base, "version", data, config(numb_steps=4, save_freq=2))
    result = run(
        dp_as_version("3.1.3", "train", "input.json"),
        workdir,
        label="dp --pt-expt train input.json (deepmd-kit reporting 3.1.3)",
    ).check()
    notes = [
        line for line in result.output.splitlines() if "supports deepmd-kit" in line
    ]
    assert notes == [
        f"dp_ckpt_plugin {_version()} supports deepmd-kit 3.2.x, found 3.1.3: the "
        "plugin is off, dp runs as deepmd-kit alone (install a deepmd-kit 3.2.x, "
        "or a dp_ckpt_plugin made for 3.1.3)"
    ]
    # deepmd-kit's own layout and nothing of the plugin's
    models = workdir / "models"
    assert steps(models, "model.ckpt") == [2, 4]
    assert records_in(models) == []
    assert lock_files(workdir) == []
    assert not (models / "checkpoint").exists()
    assert read_pointer(workdir / "checkpoint") == "models/model.ckpt-4.pt"
    assert "dp_ckpt_plugin 0" not in result.output.replace(notes[0], "")


def _version() -> str:
    from dp_ckpt_plugin import __version__

    return __version__


# -- item 3: handles for --finetune and change-bias -------------------------------


def test_finetune_takes_a_directory(trained):
    """``--finetune models`` resolves the store; the earlier run is archived."""
    workdir = trained
    result = run(dp("train", "input.json", "--finetune", "models"), workdir).check()
    out = result.output
    assert_no_traceback(result)
    assert (
        "--finetune models: models/model.ckpt-10.pt (step 10), through the pointer "
        "models/checkpoint; size and digest match its commit record; this run starts "
        "its own step count"
    ) in out
    assert "FileNotFoundError" not in out and "IsADirectoryError" not in out
    assert min(int(b) for b in BATCH.findall(out)) == 1, "fine-tuning starts at 1"
    (archive,) = (workdir / "models" / "archive").iterdir()
    assert_committed(archive / "model.ckpt-10.pt", step=10, family="model.ckpt")
    assert steps(workdir / "models", "model.ckpt") == [5, 10]
    assert payload_step(workdir / "models" / "model.ckpt-10.pt") == 10


@pytest.mark.parametrize(
    ("handle", "output", "written"),
    [
        ("latest", None, "model.ckpt-10_updated.pt"),
        ("models", "by_dir.pt", "by_dir.pt"),
        ("models/model.ckpt", "by_prefix.pt", "by_prefix.pt"),
    ],
)
def test_change_bias_takes_latest_a_directory_and_a_prefix(
    trained, handle, output, written
):
    workdir = trained
    before = tree_state(workdir / "models")
    args = ["change-bias", handle, "-s", "data/valid"]
    if output:
        args += ["-o", output]
    result = run(dp(*args), workdir).check()
    assert_no_traceback(result)
    assert f"change-bias {handle}: models/model.ckpt-10.pt, " in result.output, (
        result.describe()
    )
    assert "Change output bias" in result.output
    assert (workdir / written).is_file()
    assert "model" in _load(workdir / written)
    assert tree_state(workdir / "models") == before, "change-bias wrote into models"


def test_change_bias_of_nothing_fails_fast(trained):
    result = run(dp("change-bias", "nowhere", "-s", "data/valid"), trained)
    assert result.returncode == 1, result.describe()
    assert_no_traceback(result)
    assert "no checkpoint found" in result.output
    assert f"{trained}/nowhere.pt" in result.output


def _load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


# -- item 6: no save_dir ------------------------------------------------------------


def test_without_save_dir_a_restart_does_not_blame_the_plugin(base, data):
    workdir = make_workdir(
        base, "no_save_dir", data, config(numb_steps=4, save_freq=2, save_dir=None)
    )
    first = run(dp("train", "input.json"), workdir).check()
    assert "no save_dir, deepmd-kit's own layout beside model.ckpt" in first.output
    assert steps(workdir, "model.ckpt") == [2, 4]
    write_config(
        workdir / "input.json", config(numb_steps=6, save_freq=2, save_dir=None)
    )
    second = run(
        dp("train", "input.json", "--restart", "latest", "--skip-neighbor-stat"),
        workdir,
    ).check()
    out = second.output
    assert "written without dp_ckpt_plugin" not in out
    assert (
        "--restart latest: model.ckpt-4.pt (step 4), through the pointer checkpoint; "
        "no commit record; the CRC32 of all "
    ) in out  # rule 50
    assert "could not be verified" not in out
    assert resumed_from(out, workdir) == [(workdir / "model.ckpt-4.pt").resolve()]
    assert steps(workdir, "model.ckpt") == [4, 6]  # deepmd-kit's own window of 2
    assert lock_files(workdir) == []


# -- item 4: preemption ----------------------------------------------------------------


@pytest.fixture(scope="module")
def preempted(base, data):
    """SIGUSR1, then SIGTERM at once, to a real ``dp`` saving in the background.

    Returns
    -------
    tuple
        The working directory, the exit status, the log text and the step
        of the last batch logged before the first signal.
    """
    workdir = make_workdir(
        base, "preempted", data, config(**LONG, dp_ckpt={"async_save": True})
    )
    log = workdir / "train.log"
    began = time.monotonic()
    proc = start(dp("train", "input.json"), workdir, log)
    try:
        seen = wait_for(log, r"Batch\s+(3):", proc)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # a second signal while stopping
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(("dp --pt-expt train (SIGUSR1 + SIGTERM)", time.monotonic() - began))
    return workdir, status, log.read_text("utf-8", "replace"), int(seen.group(1))


def test_a_signal_stops_after_a_step_with_a_committed_checkpoint(preempted):
    workdir, status, out, seen = preempted
    models = workdir / "models"
    assert status == 128 + signal.SIGUSR1 == 138, out[-3000:]
    assert "Traceback" not in out
    ((name, stopped),) = STOPPED.findall(out)
    stopped = int(stopped)
    assert name == "SIGUSR1"
    assert seen <= stopped < LONG["numb_steps"]
    assert max(int(b) for b in BATCH.findall(out)) == stopped
    assert out.count("stopping before step") == 1, "the second signal was acted on"
    assert (
        f"SIGUSR1: stopped after step {stopped}; models/model.ckpt-{stopped}.pt is "
        "committed; continue with --restart latest (exit status 138)"
    ) in out
    # the background save was waited for: committed, published, nothing torn
    assert saved_steps(out) == [(f"model.ckpt-{stopped}.pt", stopped)]
    assert_committed(
        models / f"model.ckpt-{stopped}.pt", step=stopped, family="model.ckpt"
    )
    assert payload_step(models / f"model.ckpt-{stopped}.pt") == stopped
    assert read_pointer(models / "checkpoint") == f"model.ckpt-{stopped}.pt"
    assert stray_files(workdir) == []
    assert lock_files(workdir) == []


def test_restart_latest_continues_after_the_signal(base, preempted):
    """``--restart latest`` goes on from the step; the 0.2 spelling is refused."""
    workdir = copy_tree(preempted[0], base / "preempted_continued")
    stopped = int(STOPPED.findall(preempted[2])[0][1])
    cont = config(numb_steps=stopped + 3, save_freq=1000, disp_freq=1)
    section = cont["training"].pop("_dp_ckpt")
    cont["dp_ckpt"] = section  # item 1: the 0.2 spelling, refused in one line
    write_config(workdir / "input.json", cont)
    argv = dp("train", "input.json", "--restart", "latest", "--skip-neighbor-stat")
    refused = run(argv, workdir)
    assert refused.returncode != 0, refused.describe()
    assert_no_traceback(refused)
    assert (
        "the top-level `dp_ckpt` section is `training._dp_ckpt` since 0.3"
        in refused.output
    ), refused.describe()
    cont["training"]["_dp_ckpt"] = cont.pop("dp_ckpt")
    write_config(workdir / "input.json", cont)
    out = run(argv, workdir).check().output
    assert resumed_from(out, workdir) == [
        (workdir / "models" / f"model.ckpt-{stopped}.pt").resolve()
    ]
    assert min(int(b) for b in BATCH.findall(out)) == stopped + 1
    final = workdir / "models" / f"model.ckpt-{stopped + 3}.pt"
    assert payload_step(final) == stopped + 3
    assert lock_files(workdir) == []


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun at {TORCHRUN}")
def test_torchrun_ranks_stop_after_the_same_step(base, data):
    """SIGTERM to ``torchrun``: it forwards it; both ranks stop after one step."""
    workdir = make_workdir(base, "preempted_ranks", data, config(**LONG))
    logs = workdir / "torchrun_logs"
    log = workdir / "torchrun.log"
    began = time.monotonic()
    proc = start(torchrun(2, logs, "train", "input.json"), workdir, log)
    try:
        deadline = time.monotonic() + 240
        while not any(BATCH.search(t) for t in rank_logs(logs).values()):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch logged"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(
        ("torchrun 2 x dp --pt-expt train (SIGTERM)", time.monotonic() - began)
    )
    by_rank = rank_logs(logs)
    stops = {rank: STOPPED.findall(text) for rank, text in by_rank.items()}
    assert sorted(stops) == [0, 1]
    ((name0, step0),) = stops[0]
    ((name1, step1),) = stops[1]
    assert name0 == name1 == "SIGTERM"
    assert step0 == step1, f"the ranks stopped after steps {step0} and {step1}"
    step = int(step0)
    models = workdir / "models"
    assert_committed(models / f"model.ckpt-{step}.pt", step=step, family="model.ckpt")
    assert read_pointer(models / "checkpoint") == f"model.ckpt-{step}.pt"
    assert saved_steps(by_rank[1]) == []
    assert lock_files(workdir) == []
    assert stray_files(workdir) == []
    print(f"[e2e] both ranks stopped after step {step}")
