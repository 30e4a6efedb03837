"""End to end: ``dp --pt-expt train`` with ``async_save`` on (periodic and EMA).

The background writer must give the same store a synchronous run gives: every
checkpoint committed, the pointer on the last one, the EMA family saved, and
``--restart latest`` continuing from it.
"""

from __future__ import annotations

from e2e_support import (
    E2E_MARKS,
    assert_committed,
    dp,
    example_config,
    make_data,
    make_workdir,
    payload_step,
    read_pointer,
    run,
    steps,
    stray_files,
    write_config,
)

pytestmark = E2E_MARKS


def config(numb_steps):
    return example_config(
        dp_ckpt={"async_save": True},
        numb_steps=numb_steps,
        save_freq=2,
        max_ckpt_keep=3,
        save_dir="models",
        enable_ema=True,
    )


def test_async_save_commits_every_checkpoint_and_restarts(tmp_path):
    data = make_data(tmp_path / "data_source", frames=8)
    workdir = make_workdir(tmp_path, "async", data, config(10))
    run(dp("train", "input.json"), workdir).check()
    models = workdir / "models"
    assert steps(models, "model.ckpt") == [6, 8, 10]
    assert steps(models, "model_ema.ckpt") == [6, 8, 10]
    for step in (6, 8, 10):
        assert_committed(
            models / f"model.ckpt-{step}.pt", step=step, family="model.ckpt"
        )
        assert payload_step(models / f"model.ckpt-{step}.pt") == step
    assert read_pointer(models / "checkpoint") == "model.ckpt-10.pt"
    assert stray_files(workdir) == []
    write_config(workdir / "input.json", config(14))
    result = run(
        dp("train", "input.json", "--restart", "latest", "--skip-neighbor-stat"),
        workdir,
    ).check()
    assert read_pointer(models / "checkpoint") == "model.ckpt-14.pt"
    assert payload_step(models / "model.ckpt-14.pt") == 14
    assert "model.ckpt-10.pt" in result.output
