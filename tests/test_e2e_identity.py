"""End to end: installed, the plugin changes no number of deepmd-kit's ``dp --pt``.

A run from scratch with the plugin on gives the rows of ``lcurve.out`` and the
final model and optimizer tensors of the same command with
``DP_CKPT_DISABLE=1`` (plain deepmd-kit), bit for bit: for ``NUM_WORKERS`` 0,
1 and 2 (deepmd-kit's outer loader in the process, or in that many worker
processes), with and without ``save_dir``, on two training systems of
different sizes drawn with ``sys_probs`` (so the draw of the system matters),
and under ``torchrun`` on 2 CPU ranks (plain deepmd-kit through
``dp_main.py``, which lets it start on CPU ranks and changes no number).

``dp --pt-expt``: plain deepmd-kit 3.2 makes ``dp_random`` (the system of each
batch, the order of a system's frames) from the operating system's entropy,
so two plain runs differ; the plugin seeds that one generator from
``training.seed`` and nothing else, so its run is plain deepmd-kit's with
``dp_random`` seeded the same way (``dp_main.py`` again). Exact resume stays on: the plugin draws deepmd-kit's batches itself
(:mod:`dp_ckpt_plugin.deepmd.pt.batches`), and a run stopped after its
checkpoint of step 6 and continued with ``--restart latest`` gives the same
rows and tensors again.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    TORCHRUN,
    assert_same_tensors,
    dp,
    dp_env,
    example_config,
    load_payload,
    make_data,
    make_workdir,
    rank_logs,
    run,
    torchrun,
)
from e2e_support import (
    lcurve_rows as rows,
)
from helpers import free_port

pytestmark = E2E_MARKS

STEPS = 12
PLAIN = Path(__file__).with_name("dp_main.py")


def config(save_dir: bool) -> dict:
    cfg = example_config(
        numb_steps=STEPS,
        save_freq=6,
        disp_freq=1,
        max_ckpt_keep=5,
        seed=11,
        save_dir="models" if save_dir else None,
    )
    cfg["training"]["training_data"] = {
        "systems": ["data/train", "data/extra"],
        "batch_size": 2,
        "sys_probs": [0.6, 0.4],
    }
    return cfg


def final(workdir: Path) -> Path:
    (path,) = [
        p
        for p in (workdir / "models", workdir)
        if (p / f"model.ckpt-{STEPS}.pt").exists()
    ]
    return path / f"model.ckpt-{STEPS}.pt"


def assert_identical(plain: Path, plugin: Path) -> None:
    assert sorted(rows(plugin)) == list(range(1, STEPS + 1))
    assert rows(plugin) == rows(plain)
    assert_same_tensors(final(plain), final(plugin))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("identity_data")
    make_data(base / "big", frames=6)
    make_data(base / "small", frames=3)
    out = base / "data"
    out.mkdir()
    shutil.copytree(base / "big" / "train", out / "train")
    shutil.copytree(base / "big" / "valid", out / "valid")
    shutil.copytree(base / "small" / "train", out / "extra")
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory, data):
    """Plain deepmd-kit's run for ``NUM_WORKERS`` (one each, memoized)."""
    base = tmp_path_factory.mktemp("identity_plain")
    made: dict[int, Path] = {}

    def get(workers: int) -> Path:
        if workers not in made:
            workdir = make_workdir(base, f"w{workers}", data, config(True))
            env = dp_env(DP_CKPT_DISABLE="1", NUM_WORKERS=str(workers))
            argv = dp("train", "input.json", "--skip-neighbor-stat", backend="pt")
            run(argv, workdir, env=env).check()
            made[workers] = workdir
        return made[workers]

    return get


@pytest.mark.parametrize("save_dir", [True, False], ids=["save_dir", "no_save_dir"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_plugin_on_is_plain_deepmd_kit(tmp_path, data, plain, workers, save_dir):
    workdir = make_workdir(tmp_path, "on", data, config(save_dir))
    argv = dp("train", "input.json", "--skip-neighbor-stat", backend="pt")
    out = run(argv, workdir, env=dp_env(NUM_WORKERS=str(workers))).check().output
    assert_identical(plain(workers), workdir)
    if save_dir:  # exact resume was on: its state is in the checkpoint
        entry = load_payload(final(workdir))["_dp_ckpt"]
        assert entry["ranks"][0]["data"][0]["workers"] == workers
    assert "Traceback" not in out


def after_step_6(source: Path, target: Path) -> Path:
    """``source``'s run as it was after the commit of step 6 (a copy)."""
    shutil.copytree(source, target, symlinks=True)
    for path in list((target / "models").iterdir()):
        if f"-{STEPS}.pt" in path.name:
            path.unlink()
    (target / "checkpoint").write_text("models/model.ckpt-6.pt\n", "utf-8")
    alias = target / "model.ckpt.pt"
    if alias.is_symlink():
        alias.unlink()
        alias.symlink_to("models/model.ckpt-6.pt")
    lines = (target / "lcurve.out").read_text("utf-8").splitlines(keepends=True)
    kept = [x for x in lines if x.lstrip().startswith("#") or int(x.split()[0]) <= 6]
    (target / "lcurve.out").write_text("".join(kept), "utf-8")
    return target


@pytest.mark.parametrize("workers", [0, 2])
def test_stopped_and_continued_is_still_plain_deepmd_kit(
    tmp_path, data, plain, workers
):
    """A run as after its commit of step 6, continued with ``--restart latest``."""
    straight = make_workdir(tmp_path, "straight", data, config(True))
    env = dp_env(NUM_WORKERS=str(workers))
    argv = dp("train", "input.json", "--skip-neighbor-stat", backend="pt")
    run(argv, straight, env=env).check()
    workdir = after_step_6(straight, tmp_path / "continued")
    out = run([*argv, "--restart", "latest"], workdir, env=env).check().output
    assert "exact resume at step 6" in out, out[-3000:]
    assert_identical(plain(workers), workdir)


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun")
def test_two_cpu_ranks_are_plain_deepmd_kit(tmp_path, data):
    argv = ["train", "input.json", "--skip-neighbor-stat"]
    plain_dir = make_workdir(tmp_path, "plain", data, config(True))
    command = [
        str(TORCHRUN),
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        f"--log-dir={plain_dir / 'logs'}",
        "--redirects=3",
        str(PLAIN),
        "--pt",
        *argv,
    ]
    env = dp_env(DP_CKPT_DISABLE="1", NUM_WORKERS="0", PLAIN_CPU_RANKS="1")
    done = run(command, plain_dir, env=env)
    assert done.returncode == 0, "\n".join(rank_logs(plain_dir / "logs").values())[
        -3000:
    ]
    on_dir = make_workdir(tmp_path, "on", data, config(True))
    done = run(
        torchrun(2, on_dir / "logs", *argv, backend="pt"),
        on_dir,
        env=dp_env(NUM_WORKERS="0"),
    )
    assert done.returncode == 0, "\n".join(rank_logs(on_dir / "logs").values())[-3000:]
    assert_identical(plain_dir, on_dir)
    entry = load_payload(final(on_dir))["_dp_ckpt"]
    assert entry["world_size"] == 2 and len(entry["ranks"]) == 2


def test_pt_expt_is_plain_deepmd_kit_with_dp_random_seeded(tmp_path, data):
    argv = ["--pt-expt", "train", "input.json", "--skip-neighbor-stat"]
    plain_dir = make_workdir(tmp_path, "plain", data, config(True))
    env = dp_env(DP_CKPT_DISABLE="1", PLAIN_DP_RANDOM_SEED="11")
    run([sys.executable, str(PLAIN), *argv], plain_dir, env=env).check()
    on_dir = make_workdir(tmp_path, "on", data, config(True))
    run(dp(*argv[1:], backend="pt-expt"), on_dir).check()
    assert_identical(plain_dir, on_dir)


@pytest.mark.parametrize("workers", [0, 2])
def test_under_deepmds_default_device_guard(tmp_path, data, workers):
    """deepmd-kit's tests set ``torch.set_default_device("cuda:9999999")``.

    A tensor the plugin made without naming its device would fail there: a
    run with ``save_dir``, exact resume and a restart from ``latest`` pass.
    """
    workdir = make_workdir(tmp_path, "guarded", data, config(True))
    env = dp_env(NUM_WORKERS=str(workers), DEFAULT_DEVICE="cuda:9999999")
    argv = [sys.executable, str(PLAIN), "--pt", "train", "input.json"]
    run([*argv, "--skip-neighbor-stat"], workdir, env=env).check()
    out = (
        run([*argv, "--skip-neighbor-stat", "--restart", "latest"], workdir, env=env)
        .check()
        .output
    )
    assert f"exact resume at step {STEPS}" in out, out[-3000:]
