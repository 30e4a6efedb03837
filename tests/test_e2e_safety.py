"""End to end: real ``dp --pt-expt`` runs never destroy or misread a checkpoint.

- ``--init-model latest`` and a fresh train in a ``save_dir`` holding an earlier
  run archive that run (rule 14) instead of overwriting and retaining it away.
- ``--restart latest`` on a ``save_dir`` of another model ends before training
  with one message naming the checkpoint and the first parameter that differs,
  and ``save_dir`` is left as it was.
- The plugin's own mirror beside a ``save_ckpt`` prefix in its own directory
  resolves (rule 19): ``--restart ckpt/model.ckpt``.
"""

from __future__ import annotations

import pytest
from e2e_support import (
    E2E_MARKS,
    copy_tree,
    dp,
    example_config,
    make_data,
    make_workdir,
    read_pointer,
    run,
    sha256,
    tree_state,
    write_config,
)

pytestmark = E2E_MARKS

TRAINING = {"numb_steps": 10, "save_freq": 5, "max_ckpt_keep": 1, "save_dir": "models"}


def config(**changes):
    return example_config(**{**TRAINING, **changes})


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_safety")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=8)


@pytest.fixture(scope="module")
def first(base, data):
    """A 10-step run: ``models/model.ckpt-10.pt`` (window 1)."""
    workdir = make_workdir(base, "first", data, config())
    run(dp("train", "input.json"), workdir).check()
    return workdir


@pytest.mark.parametrize("how", ["init-model-latest", "fresh"])
def test_a_new_run_archives_the_earlier_run(base, first, how):
    workdir = copy_tree(first, base / how)
    origin = workdir / "models" / "model.ckpt-10.pt"
    digest = sha256(origin)
    args = ["train", "input.json"]
    if how == "init-model-latest":
        args += ["--init-model", "latest"]
    result = run(dp(*args), workdir).check()
    archives = sorted((workdir / "models" / "archive").iterdir())
    assert len(archives) == 1, result.describe()
    kept = archives[0] / "model.ckpt-10.pt"
    # the earlier run's checkpoint, with its record, intact in the archive
    assert sha256(kept) == digest
    assert (archives[0] / ".model.ckpt-10.pt.commit.json").is_file()
    assert read_pointer(archives[0] / "checkpoint") == "model.ckpt-10.pt"
    assert "archived 1 checkpoint(s) of an earlier run" in result.output
    # the new run's own step 10 is a new file, published (a fresh run of the
    # same seeded input may hold the same bytes: rule 34)
    new = workdir / "models" / "model.ckpt-10.pt"
    assert new.stat().st_ino != kept.stat().st_ino
    if how == "init-model-latest":
        assert sha256(new) != digest
    assert read_pointer(workdir / "models" / "checkpoint") == "model.ckpt-10.pt"


def test_a_restart_that_cannot_fit_ends_before_training(base, first):
    workdir = copy_tree(first, base / "other_model")
    other = config(numb_steps=15)
    other["model"]["fitting_net"]["neuron"] = [6, 6]
    write_config(workdir / "input.json", other)
    before = tree_state(workdir / "models")
    result = run(dp("train", "input.json", "--restart", "latest"), workdir)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" not in result.output, result.describe()
    assert "model.ckpt-10.pt does not fit the model of this input" in result.output
    assert "parameter" in result.output and "fitting" in result.output
    after = tree_state(workdir / "models")
    holder = ".dp_ckpt.holder.json"
    assert {k: v for k, v in after.items() if k != holder} == {
        k: v for k, v in before.items() if k != holder
    }


def test_the_prefix_mirror_in_its_own_directory_resolves(base, data):
    workdir = make_workdir(
        base, "prefix_dir", data, config(save_ckpt="ckpt/model.ckpt", numb_steps=5)
    )
    (workdir / "ckpt").mkdir()
    run(dp("train", "input.json"), workdir).check()
    assert (workdir / "ckpt" / "model.ckpt.pt").resolve() == (
        workdir / "models" / "model.ckpt-5.pt"
    )
    write_config(
        workdir / "input.json", config(save_ckpt="ckpt/model.ckpt", numb_steps=10)
    )
    result = run(
        dp(
            "train",
            "input.json",
            "--restart",
            "ckpt/model.ckpt",
            "--skip-neighbor-stat",
        ),
        workdir,
    ).check()
    assert "refusing" not in result.output
    assert read_pointer(workdir / "models" / "checkpoint") == "model.ckpt-10.pt"
