"""End to end: the real ``dp --pt-expt`` command on tiny data, in subprocesses.

Each ``dp`` run costs seconds (importing torch and deepmd-kit dominates), so
one trained run is shared through module-scoped fixtures, and every fixture
that continues a run works on a copy of its directory. Runs:

``main``
    ``dp --pt-expt train`` with ``save_dir: models``, 20 steps, a checkpoint
    every 5, a window of 2 and EMA on. Read, never written, by later runs.
``restarted``
    A copy of ``main``, continued to step 30 with ``--restart latest``.
``relocated``
    A fresh directory restarting from a moved copy of ``main/models`` and
    continuing under another ``save_ckpt`` name (``run.ckpt``), then frozen
    with ``freeze -c models`` and evaluated with ``dp test``. ``main`` itself is
    frozen with ``freeze`` in its working directory. (Three freezes would cost
    a fifth of the module's time; these two cover ``-c D`` and the working
    directory, the default name and a custom one.)
``plain``
    ``DP_CKPT_DISABLE=1``: deepmd-kit's own code, for the layout and payloads;
    the input carries ``training._dp_ckpt``, which deepmd-kit alone accepts.
    A copy continued by the plugin with ``--restart models`` adopts it.
``two_ranks``
    ``torchrun`` with two CPU ranks and ``save_ckpt: run.ckpt``, then a copy
    continued with ``--restart latest`` on two ranks.

Run with ``pytest tests/test_e2e.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    ENERGY_RMSE,
    SAVE_LINE,
    TORCHRUN,
    Result,
    assert_committed,
    assert_no_traceback,
    copy_tree,
    dp,
    dp_env,
    example_config,
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
    steps,
    stray_files,
    torchrun,
    tree_state,
    unmatched_variables,
    write_config,
)

pytestmark = E2E_MARKS

FRAMES = 12
"""Training frames of the generated data (the validation set gets 3)."""

TRAINING = {
    "numb_steps": 20,
    "save_freq": 5,
    "max_ckpt_keep": 2,
    "save_dir": "models",
    "enable_ema": True,
}
"""The ``training`` keys of every run, on top of ``examples/input.json``."""

FAST = 30.0
"""Seconds within which a refused run must have ended."""

STARTUP = re.compile(r"dp_ckpt_plugin \S+ \(dp --pt-expt\): save_dir models, ")
"""The plugin's one start-up line."""

RESTART_LINE = re.compile(
    r"--restart (\S+): (\S+) \(step (\d+)\), ([^;]+); (.+)$", re.M
)
"""The plugin's line naming the checkpoint a restart resolved to, how and why."""

BATCH = re.compile(r"Batch\s+(\d+):")
"""deepmd-kit's log line for each displayed training step."""


@dataclass
class Run:
    """A working directory and the ``dp`` command that ran in it.

    Attributes
    ----------
    workdir : Path
        The working directory.
    result : Result
        The outcome of the command.
    """

    workdir: Path
    result: Result

    @property
    def models(self) -> Path:
        """The ``save_dir`` of the run."""
        return self.workdir / "models"


def training_config(**changes):
    """:data:`TRAINING` on top of the example input, with ``changes``."""
    dp_ckpt = changes.pop("dp_ckpt", None)
    return example_config(dp_ckpt=dp_ckpt, **{**TRAINING, **changes})


def batches(text: str) -> list[int]:
    """The training steps a log displays."""
    return sorted({int(s) for s in BATCH.findall(text)})


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A directory holding every working directory of this module."""
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def data(base) -> Path:
    """The tiny Cu/Ag training and validation sets."""
    return make_data(base / "data_source", frames=FRAMES)


@pytest.fixture(scope="module")
def main_run(base, data) -> Run:
    """Train 20 steps with ``save_dir``, EMA and a window of 2."""
    workdir = make_workdir(base, "main", data, training_config())
    return Run(workdir, run(dp("train", "input.json"), workdir).check())


@pytest.fixture(scope="module")
def restarted_run(base, main_run) -> Run:
    """A copy of the main run continued to step 30 with ``--restart latest``."""
    workdir = copy_tree(main_run.workdir, base / "restarted")
    write_config(workdir / "input.json", training_config(numb_steps=30))
    result = run(dp("train", "input.json", "--restart", "latest"), workdir)
    return Run(workdir, result.check())


@pytest.fixture(scope="module")
def relocated(base, data, main_run):
    """Move a copy of the main run's store elsewhere and restart from it there.

    The new run has its own ``save_dir`` and ``save_ckpt: run.ckpt``, and
    trains to step 25.

    Returns
    -------
    tuple
        The run, the moved store, and the state of the moved store before the run.
    """
    staging = copy_tree(main_run.models, base / "staging" / "models")
    moved = base / "elsewhere" / "deep" / "moved_store"
    moved.parent.mkdir(parents=True)
    shutil.move(staging, moved)
    before = tree_state(moved)
    config = training_config(numb_steps=25, save_ckpt="run.ckpt")
    workdir = make_workdir(base, "relocated", data, config)
    spec = os.path.relpath(moved, workdir)
    result = run(dp("train", "input.json", "--restart", spec), workdir)
    return Run(workdir, result.check()), moved, before


@pytest.fixture(scope="module")
def frozen_by_dir(relocated) -> Result:
    """``dp --pt-expt freeze -c models -o frozen`` of the relocated run."""
    return run(dp("freeze", "-c", "models", "-o", "frozen"), relocated[0].workdir)


@pytest.fixture(scope="module")
def evaluated(relocated, frozen_by_dir) -> Result:
    """``dp --pt-expt test`` of that ``frozen.pte`` on the validation set."""
    frozen_by_dir.check()
    workdir = relocated[0].workdir
    return run(dp("test", "-m", "frozen.pte", "-s", "data/valid"), workdir)


@pytest.fixture(scope="module")
def frozen_in_cwd(main_run) -> Result:
    """``dp --pt-expt freeze`` (no ``-c``) in the main run's working directory."""
    return run(dp("freeze"), main_run.workdir)


@pytest.fixture(scope="module")
def plain_run(base, data) -> Run:
    """The same training with the plugin off (deepmd-kit's own code)."""
    workdir = make_workdir(base, "plain", data, training_config())
    result = run(
        dp("train", "input.json"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt-expt train input.json",
    )
    return Run(workdir, result.check())


@pytest.fixture(scope="module")
def plain_from_plugin(base, main_run) -> Run:
    """A copy of the main run continued to step 25 by plain deepmd-kit."""
    workdir = copy_tree(main_run.workdir, base / "plain_from_plugin")
    write_config(workdir / "input.json", training_config(numb_steps=25))
    result = run(
        dp("train", "input.json", "--restart", "models/model.ckpt-20.pt"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt-expt train --restart models/model.ckpt-20.pt",
    )
    return Run(workdir, result.check())


@pytest.fixture(scope="module")
def plugin_from_plain(base, plain_run) -> Run:
    """A copy of the plain run continued to step 25 through the plugin.

    ``--restart models``: the plugin adopts the directory plain deepmd-kit wrote.
    """
    workdir = copy_tree(plain_run.workdir, base / "plugin_from_plain")
    write_config(workdir / "input.json", training_config(numb_steps=25))
    result = run(dp("train", "input.json", "--restart", "models"), workdir)
    return Run(workdir, result.check())


@pytest.fixture(scope="module")
def bad_workdir(base, data) -> Path:
    """A directory with a valid input and two broken ones."""
    workdir = make_workdir(base, "bad", data, training_config())
    write_config(
        workdir / "unknown_key.json", training_config(dp_ckpt={"verfy": "size"})
    )
    old = training_config()
    old["training"].pop("_dp_ckpt")
    old["dp_ckpt"] = {"verfy": "size"}
    write_config(workdir / "old_section.json", old)
    write_config(
        workdir / "url_save_dir.json", training_config(save_dir="ftp://bucket/run")
    )
    write_config(
        workdir / "file_save_dir.json", training_config(save_dir="not_a_directory")
    )
    (workdir / "not_a_directory").write_text("a regular file\n")
    return workdir


@pytest.fixture(scope="module")
def two_ranks(base, data):
    """Two CPU ranks under torchrun, ``save_ckpt: run.ckpt``, 10 steps.

    Returns
    -------
    tuple
        The run and the output of each rank.
    """
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun at {TORCHRUN}")
    workdir = make_workdir(
        base, "two_ranks", data, training_config(numb_steps=10, save_ckpt="run.ckpt")
    )
    logs = workdir / "torchrun_logs_train"
    result = run(torchrun(2, logs, "train", "input.json"), workdir)
    return Run(workdir, result.check()), rank_logs(logs)


@pytest.fixture(scope="module")
def two_ranks_restarted(two_ranks):
    """A copy of the two-rank run continued to step 20, ``--restart latest``.

    Returns
    -------
    tuple
        The run and the output of each rank.
    """
    workdir = copy_tree(
        two_ranks[0].workdir, two_ranks[0].workdir.parent / "two_ranks_restarted"
    )
    write_config(
        workdir / "input.json", training_config(numb_steps=20, save_ckpt="run.ckpt")
    )
    logs = workdir / "torchrun_logs_restart"
    result = run(
        torchrun(2, logs, "train", "input.json", "--restart", "latest"), workdir
    )
    return Run(workdir, result.check()), rank_logs(logs)


# -- rules 1-3: layout ----------------------------------------------------------------


def test_layout_with_save_dir(main_run):
    """Numbered files, window, pointers, aliases and records of a finished run."""
    models, cwd = main_run.models, main_run.workdir
    assert_no_traceback(main_run.result)

    # Rule 1, with the window of 2 applied to each family.
    assert steps(models, "model.ckpt") == [15, 20]
    assert steps(models, "model_ema.ckpt") == [15, 20]
    saved = saved_steps(main_run.result.output)
    assert saved == [(f"model.ckpt-{s}.pt", s) for s in (5, 10, 15, 20)], (
        "every save goes through the store, one line each"
    )

    # Rule 6: one record per file left, matching its bytes; none for pruned ones.
    for family in ("model.ckpt", "model_ema.ckpt"):
        for step in (15, 20):
            assert_committed(models / f"{family}-{step}.pt", step=step, family=family)
    assert records_in(models) == sorted(
        f"{f}-{s}.pt" for f in ("model.ckpt", "model_ema.ckpt") for s in (15, 20)
    )

    # Rule 2: pointer and aliases inside the store, relative to it.
    assert read_pointer(models / "checkpoint") == "model.ckpt-20.pt"
    assert read_pointer(models / "checkpoint.model_ema.ckpt") == "model_ema.ckpt-20.pt"
    assert os.readlink(models / "model.ckpt.pt") == "model.ckpt-20.pt"
    assert os.readlink(models / "model_ema.ckpt.pt") == "model_ema.ckpt-20.pt"

    # Rule 3: deepmd-kit's pointer and aliases in the working directory.
    assert read_pointer(cwd / "checkpoint") == "models/model.ckpt-20.pt"
    for alias, target in (
        ("model.ckpt.pt", "model.ckpt-20.pt"),
        ("model_ema.ckpt.pt", "model_ema.ckpt-20.pt"),
    ):
        assert (cwd / alias).is_symlink()
        assert (cwd / alias).resolve() == (models / target).resolve()

    # Rule 5: no temporary file is left anywhere, nor the lock.
    assert stray_files(cwd) == []
    assert lock_files(cwd) == []
    assert payload_step(models / "model.ckpt-20.pt") == 20


def test_logs_say_what_a_user_can_act_on(main_run):
    """Issue 9, item 5: one start-up line, one line per save, the real place at the end."""
    out = main_run.result.output
    assert len(STARTUP.findall(out)) == 1, out[:3000]
    (startup,) = [line for line in out.splitlines() if STARTUP.search(line)]
    for part in ("keep the newest 2", "verify digest", "SIGTERM, SIGUSR1"):
        assert part in startup
    save_lines = [line for line in out.splitlines() if "saved step" in line]
    assert len(save_lines) == 4
    for line in save_lines:
        assert SAVE_LINE.search(line), line
        assert "models/model.ckpt-" in line and "model_ema.ckpt-" in line
    # the line it replaces: the store's per-family one; deepmd-kit's stay (issue 36)
    assert "committed " not in out
    assert out.count("Saved model to models/model.ckpt-") == 4
    assert "Trained model has been saved to: model.ckpt" in out
    assert (
        "training ended; the latest checkpoint is models/model.ckpt-20.pt (step 20), "
        "named by models/checkpoint"
    ) in out
    assert "/../" not in out


# -- rule 16: restart latest --------------------------------------------------------


def test_restart_latest_continues_the_step_count(restarted_run):
    """``--restart latest`` resumes at step 20 and saves 25 and 30, window 2."""
    models, out = restarted_run.models, restarted_run.result.output
    assert_no_traceback(restarted_run.result)
    assert resumed_from(out, restarted_run.workdir) == [
        (models / "model.ckpt-20.pt").resolve()
    ]
    assert min(batches(out)) > 20, "the step count started over"

    assert steps(models, "model.ckpt") == [25, 30]
    assert steps(models, "model_ema.ckpt") == [25, 30]
    for step in (25, 30):
        assert payload_step(models / f"model.ckpt-{step}.pt") == step
        assert_committed(
            models / f"model.ckpt-{step}.pt", step=step, family="model.ckpt"
        )
    assert read_pointer(models / "checkpoint") == "model.ckpt-30.pt"
    assert (
        read_pointer(restarted_run.workdir / "checkpoint") == "models/model.ckpt-30.pt"
    )
    assert stray_files(restarted_run.workdir) == []
    # issue 9, item 5: which checkpoint, how it was found, how it was checked
    (line,) = RESTART_LINE.findall(out)
    assert line == (
        "latest",
        "models/model.ckpt-20.pt",
        "20",
        "through the pointer models/checkpoint",
        "size and digest match its commit record",
    )


# -- rules 2 and 17: a relocated store ----------------------------------------------


def test_moved_store_restarts_from_its_new_place(relocated):
    """``--restart <moved directory>`` resumes from step 20 and leaves it alone."""
    new_run, moved, before = relocated
    out = new_run.result.output
    assert_no_traceback(new_run.result)
    assert resumed_from(out, new_run.workdir) == [
        (moved / "model.ckpt-20.pt").resolve()
    ]
    assert min(batches(out)) > 20
    assert steps(new_run.models, "run.ckpt") == [25]
    assert payload_step(new_run.models / "run.ckpt-25.pt") == 25
    assert_committed(new_run.models / "run.ckpt-25.pt", step=25, family="run.ckpt")
    assert tree_state(moved) == before, "the run wrote into the store it resumed from"
    # the handle was ../elsewhere/deep/moved_store: shown normalized, absolute
    (line,) = RESTART_LINE.findall(out)
    assert line[1] == str((moved / "model.ckpt-20.pt").resolve())
    assert "/../" not in out


# -- rule 22: freezing -------------------------------------------------------------


def test_freeze_directory_with_custom_save_ckpt_evaluates(
    relocated, frozen_by_dir, evaluated
):
    """``freeze -c models`` freezes the latest ``run.ckpt``; the model evaluates."""
    new_run, moved, _ = relocated
    assert_no_traceback(frozen_by_dir)
    frozen_by_dir.check()
    frozen_file = new_run.workdir / "frozen.pte"
    assert unmatched_variables(frozen_file, new_run.models / "run.ckpt-25.pt") == []
    assert unmatched_variables(frozen_file, moved / "model.ckpt-20.pt") != []

    assert_no_traceback(evaluated)
    evaluated.check()
    rmse = [float(x) for x in ENERGY_RMSE.findall(evaluated.output)]
    assert rmse, evaluated.describe()
    assert all(math.isfinite(x) for x in rmse)


def test_freeze_in_working_directory(main_run, frozen_in_cwd):
    """``dp --pt-expt freeze`` without ``-c`` freezes the latest checkpoint."""
    models = main_run.models
    assert_no_traceback(frozen_in_cwd)
    frozen_in_cwd.check()
    frozen_file = main_run.workdir / "frozen_model.pte"
    assert unmatched_variables(frozen_file, models / "model.ckpt-20.pt") == []
    assert unmatched_variables(frozen_file, models / "model.ckpt-15.pt") != []


# -- rules 16, 21 and input checks: fail fast, no traceback --------------------------


BAD_CASES = {
    "restart_names_nothing": (
        ["input.json", "--restart", "nowhere"],
        ["no checkpoint found", "looked at", "{cwd}/nowhere", "{cwd}/nowhere.pt"],
    ),
    "unknown_dp_ckpt_key": (
        ["unknown_key.json"],
        ["training/_dp_ckpt/verfy", "Did you mean", "verify"],
    ),
    "old_section_of_0_2": (
        ["old_section.json"],
        ["the top-level `dp_ckpt` section is `training._dp_ckpt` since 0.3"],
    ),
    "save_dir_is_a_url": (
        ["url_save_dir.json"],
        ["training.save_dir", "'ftp://bucket/run'", "no storage serves ftp://"],
    ),
    "save_dir_is_a_file": (
        ["file_save_dir.json"],
        ["save_dir", "{cwd}/not_a_directory", "not a directory"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_mistake_fails_fast_without_traceback(bad_workdir, case):
    """A bad handle or input ends in seconds, before any data is read."""
    args, expected = BAD_CASES[case]
    result = run(dp("train", *args), bad_workdir, timeout=120)
    print(f"[e2e] {case}: refused after {result.seconds:.2f} s")
    assert result.returncode != 0, result.describe()
    assert_no_traceback(result)
    for text in expected:
        assert text.format(cwd=bad_workdir) in result.output, result.describe()
    assert "Summary of DataSystem" not in result.output, "data was built first"
    assert result.seconds < FAST
    # a run that failed to start leaves nothing: no lock, no save_dir it made
    assert not (bad_workdir / "models").exists(), result.describe()
    assert not (bad_workdir / "s3:").exists()
    assert lock_files(bad_workdir) == []


# -- rule 10: one writer -------------------------------------------------------------


def test_second_writer_is_refused(base, data):
    """A run on a store this process holds is refused fast, naming this pid."""
    from dp_ckpt_plugin.store.lock import StoreLock

    workdir = make_workdir(base, "locked", data, training_config())
    (workdir / "models").mkdir()
    lock = StoreLock(workdir / "models")
    lock.acquire()
    try:
        result = run(dp("train", "input.json"), workdir, timeout=120)
        # the refused run removed nothing of the holder's
        assert lock_files(workdir) == [
            str(workdir / "models" / n)
            for n in (".dp_ckpt.holder.json", ".dp_ckpt.lock")
        ]
    finally:
        lock.release()
    print(f"[e2e] second writer refused after {result.seconds:.2f} s")
    assert result.returncode != 0, result.describe()
    assert_no_traceback(result)
    assert f"pid {os.getpid()}" in result.output, result.describe()
    assert str(workdir / "models") in result.output
    assert result.seconds < FAST
    assert steps(workdir / "models", "model.ckpt") == []


# -- DP_CKPT_DISABLE ------------------------------------------------------------------


def test_disabled_plugin_leaves_deepmd_layout(plain_run):
    """With ``DP_CKPT_DISABLE=1`` deepmd-kit writes its own layout, untouched.

    The input is the plugin's, ``training._dp_ckpt`` included (issue 9, item 1):
    deepmd-kit alone runs it unchanged.
    """
    models, cwd, out = plain_run.models, plain_run.workdir, plain_run.result.output
    assert "_dp_ckpt" in (cwd / "input.json").read_text()
    assert "ArgumentKeyError" not in out
    assert steps(models, "model.ckpt") == [15, 20]
    assert steps(models, "model_ema.ckpt") == [15, 20]
    assert records_in(models) == []
    assert not (models / "checkpoint").exists()
    assert not (models / "model.ckpt.pt").exists()
    assert not (models / ".dp_ckpt.lock").exists()
    assert stray_files(cwd) == []
    assert read_pointer(cwd / "checkpoint") == "models/model.ckpt-20.pt"
    assert os.readlink(cwd / "model.ckpt.pt") == "models/model.ckpt-20.pt"
    assert saved_steps(out) == [], "the plugin logged a save"
    assert "dp_ckpt_plugin" not in out


# -- interoperability with plain deepmd-kit --------------------------------------------


def test_plugin_checkpoint_restarts_under_plain_deepmd(plain_from_plugin):
    """deepmd-kit alone resumes a plugin checkpoint and continues the count."""
    models, out = plain_from_plugin.models, plain_from_plugin.result.output
    assert_no_traceback(plain_from_plugin.result)
    assert resumed_from(out, plain_from_plugin.workdir) == [
        (models / "model.ckpt-20.pt").resolve()
    ]
    assert min(batches(out)) > 20
    assert 25 in steps(models, "model.ckpt")
    assert payload_step(models / "model.ckpt-25.pt") == 25
    assert read_pointer(plain_from_plugin.workdir / "checkpoint") == (
        "models/model.ckpt-25.pt"
    )


def test_plain_save_dir_is_adopted_and_retained(plugin_from_plain):
    """Issue 9, item 3: ``--restart models`` adopts what plain deepmd-kit wrote.

    Each numbered file loads with torch and gets a commit record (with a
    note); the restart resumes from the newest, and from then on retention
    applies to the adopted files too (window 2).
    """
    models, out = plugin_from_plain.models, plugin_from_plain.result.output
    assert_no_traceback(plugin_from_plain.result)
    assert (
        "adopted 4 checkpoint(s) that plain deepmd-kit wrote in models (steps 15, 20)"
    ) in out
    (line,) = RESTART_LINE.findall(out)
    assert line[:3] == ("models", "models/model.ckpt-20.pt", "20")
    assert "adopted from plain deepmd-kit" in line[4]
    assert resumed_from(out, plugin_from_plain.workdir) == [
        (models / "model.ckpt-20.pt").resolve()
    ]
    assert min(batches(out)) > 20
    assert payload_step(models / "model.ckpt-25.pt") == 25
    assert_committed(models / "model.ckpt-25.pt", step=25, family="model.ckpt")
    assert_committed(models / "model.ckpt-20.pt", step=20, family="model.ckpt")
    assert steps(models, "model.ckpt") == [20, 25]
    assert steps(models, "model_ema.ckpt") == [20, 25]
    assert records_in(models) == sorted(
        f"{f}-{s}.pt" for f in ("model.ckpt", "model_ema.ckpt") for s in (20, 25)
    )
    assert read_pointer(models / "checkpoint") == "model.ckpt-25.pt"
    assert lock_files(plugin_from_plain.workdir) == []


def test_payload_structure_matches_plain_deepmd(main_run, plain_run):
    """Plugin and deepmd-kit checkpoints hold the same keys at every level."""
    for name in ("model.ckpt-20.pt", "model_ema.ckpt-20.pt"):
        ours = payload_structure(main_run.models / name)
        theirs = payload_structure(plain_run.models / name)
        assert ours == theirs, name
    periodic = payload_structure(main_run.models / "model.ckpt-20.pt")
    assert periodic["top"] == ["ema", "model", "optimizer"]
    assert "_extra_state" in periodic["model"]
    assert "step" in periodic["train_infos"]
    assert payload_structure(main_run.models / "model_ema.ckpt-20.pt")["top"] == [
        "model"
    ]


def test_checkpoints_are_valid_zip_archives_as_torch_save_writes(main_run, tmp_path):
    """Each checkpoint passes zipfile's and unzip's CRC checks and is torch.save's file.

    Byte for byte what ``torch.save`` of its payload to a path of the same
    name writes with torch's defaults (the archive's folder is named after
    the file, as deepmd-kit's own are).
    """
    import subprocess
    import zipfile

    import torch

    unzip = shutil.which("unzip")
    files = [p for p in sorted(main_run.models.glob("*.pt")) if not p.is_symlink()]
    assert len(files) == 4
    for path in files:
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None, path.name
            names = archive.namelist()
        assert all(n.startswith(path.name.removesuffix(".pt") + "/") for n in names)
        if unzip is not None:
            done = subprocess.run([unzip, "-t", path], capture_output=True, text=True)
            assert done.returncode == 0, done.stdout
        again = tmp_path / path.name
        torch.save(torch.load(path, weights_only=False), again)
        assert again.read_bytes() == path.read_bytes(), path.name


# -- rule 9: two ranks ----------------------------------------------------------------


def test_two_ranks_only_the_chief_writes(two_ranks):
    """Two gloo ranks train; one set of files and records, logged by rank 0 only."""
    run_, logs = two_ranks
    models, cwd = run_.models, run_.workdir
    assert_no_traceback(run_.result)
    assert sorted(logs) == [0, 1], f"rank logs: {sorted(logs)}"
    assert steps(models, "run.ckpt") == [5, 10]
    assert steps(models, "run_ema.ckpt") == [5, 10]
    for family in ("run.ckpt", "run_ema.ckpt"):
        for step in (5, 10):
            assert_committed(models / f"{family}-{step}.pt", step=step, family=family)
    assert len(records_in(models)) == 4
    assert saved_steps(logs[0]) == [("run.ckpt-5.pt", 5), ("run.ckpt-10.pt", 10)]
    assert saved_steps(logs[1]) == [], "rank 1 committed a checkpoint"
    assert read_pointer(models / "checkpoint") == "run.ckpt-10.pt"
    assert read_pointer(cwd / "checkpoint") == "models/run.ckpt-10.pt"
    assert (cwd / "run.ckpt.pt").resolve() == (models / "run.ckpt-10.pt").resolve()
    assert stray_files(cwd) == []


def test_two_ranks_restart_latest_resume_the_same_checkpoint(two_ranks_restarted):
    """Both ranks resume from ``run.ckpt-10.pt`` and the count goes on to 20."""
    run_, logs = two_ranks_restarted
    models = run_.models
    assert_no_traceback(run_.result)
    expected = [(models / "run.ckpt-10.pt").resolve()]
    assert resumed_from(logs[0], run_.workdir) == expected
    assert resumed_from(logs[1], run_.workdir) == expected
    assert min(batches(logs[0])) > 10
    assert steps(models, "run.ckpt") == [15, 20]
    assert payload_step(models / "run.ckpt-20.pt") == 20
    assert_committed(models / "run.ckpt-20.pt", step=20, family="run.ckpt")
    assert saved_steps(logs[1]) == []
    assert stray_files(run_.workdir) == []


def test_best_validation_files_and_bias_resave(base, data):
    """Best-validation files keep the place validating.save_best_dir names; the
    bias re-save is committed. (Without save_best_dir they go into save_dir:
    test_e2e_commands.py.)"""
    config = training_config(change_bias_after_training=True)
    config["validating"] = {
        "full_validation": True,
        "validation_freq": 5,
        "full_val_start": 0.0,
        "save_best_dir": ".",
    }
    workdir = make_workdir(base, "best_and_bias", data, config)
    result = run(dp("train", "input.json"), workdir).check()
    text = result.stdout + result.stderr
    # deepmd-kit names and places best files itself where save_best_dir says
    # (the working directory here); the plugin writes them atomically but
    # never prunes or records them
    best = sorted(workdir.glob("best.ckpt-*.t-*.pt"))
    assert best, text[-2000:]
    assert not list(workdir.glob(".best*.commit.json"))
    assert not list((workdir / "models").glob("best*"))
    # the final step is saved twice (after the bias change); both commits go
    # through the store and the record describes the second payload
    final = workdir / "models" / "model.ckpt-20.pt"
    assert saved_steps(text).count(("model.ckpt-20.pt", 20)) == 2
    assert_committed(final, step=20, family="model.ckpt")
    assert steps(workdir / "models", "model.ckpt") == [15, 20]
    assert stray_files(workdir) == []
