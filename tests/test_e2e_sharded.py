"""End to end: ``training.zero_stage`` 1, 2 and 3 on two CPU ranks, both backends.

For each backend and stage, ``torchrun --nproc_per_node=2`` (gloo) trains,
is stopped by ``SIGTERM`` (forwarded to the ranks: both stop after the same
step and the chief commits it), continues with ``--restart latest`` at the
same stage, and the result is frozen. The optimizer state is resumed, not
started afresh: its Adam step counts on.

Plain deepmd-kit 3.2 cannot restart stages 2 and 3 of ``dp --pt`` (a strict
optimizer load refuses the zero-size compression placeholders that never
get state) and loses work when a restart changes between stages 0/1 and 2/3
(the state is keyed by position or by name); the plugin re-keys and loads
what this stage needs (``deepmd/optimizer_state.py``). Two runs change stage:
``dp --pt`` from 1 to 3, ``dp --pt-expt`` from 2 to one process.

Run with ``pytest tests/test_e2e_sharded.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from e2e_support import (
    DP,
    TIMINGS,
    TORCHRUN,
    assert_committed,
    assert_no_rank_died,
    copy_tree,
    dp,
    dp_env,
    example_config,
    load_payload,
    lock_files,
    make_data,
    make_workdir,
    rank_logs,
    resumed_from,
    run,
    start,
    stray_files,
    torchrun,
    write_config,
)
from helpers import needs_torch

pytestmark = [
    pytest.mark.e2e,
    needs_torch,
    pytest.mark.skipif(not DP.exists(), reason=f"no dp command at {DP}"),
    pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun at {TORCHRUN}"),
]

BACKENDS = ("pt", "pt-expt")
STAGES = (1, 2, 3)
STOPPED = re.compile(r"SIGTERM: stopped after step (\d+);")
BATCH = re.compile(r"Batch\s+(\d+):")
FROZEN = {"pt": ".pth", "pt-expt": ".pte"}


def config(stage: int, numb_steps: int):
    return example_config(
        numb_steps=numb_steps, save_freq=1000, disp_freq=1, zero_stage=stage
    )


def adam_step(path: Path) -> float:
    """The Adam step count the checkpoint's optimizer state records."""
    state = load_payload(path)["optimizer"]["state"]
    return max(float(s["step"]) for s in state.values() if "step" in s)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_sharded")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=6)


def stop_two_ranks(workdir: Path, backend: str) -> tuple[dict[int, str], int]:
    """Train on two ranks until a few steps are done, then SIGTERM torchrun."""
    logs = workdir / "torchrun_logs"
    log = workdir / "torchrun.log"
    began = time.monotonic()
    proc = start(
        torchrun(2, logs, "train", "input.json", backend=backend), workdir, log
    )
    try:
        deadline = time.monotonic() + 240
        while not any(
            int(b) >= 3 for t in rank_logs(logs).values() for b in BATCH.findall(t)
        ):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch logged"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    TIMINGS.append(
        (f"torchrun 2 x dp --{backend} train (SIGTERM)", time.monotonic() - began)
    )
    by_rank = rank_logs(logs)
    assert_no_rank_died(by_rank)
    stops = {rank: STOPPED.findall(text) for rank, text in by_rank.items()}
    assert sorted(stops) == [0, 1], log.read_text()[-3000:]
    assert stops[0] == stops[1] and len(stops[0]) == 1, stops
    return by_rank, int(stops[0][0])


@pytest.fixture(scope="module")
def sharded(base, data):
    """``sharded(backend, stage)``: stopped, restarted at the same stage; memoized."""
    made = {}

    def get(backend: str, stage: int):
        key = (backend, stage)
        if key in made:
            return made[key]
        workdir = make_workdir(
            base, f"{backend}_stage{stage}", data, config(stage, 3000)
        )
        _, stopped = stop_two_ranks(workdir, backend)
        models = workdir / "models"
        assert_committed(
            models / f"model.ckpt-{stopped}.pt", step=stopped, family="model.ckpt"
        )
        assert lock_files(workdir) == []
        write_config(workdir / "input.json", config(stage, stopped + 2))
        logs = workdir / "restart_logs"
        run(
            torchrun(
                2, logs, "train", "input.json", "--restart", "latest", backend=backend
            ),
            workdir,
            label=f"torchrun 2 x dp --{backend} train --restart latest (stage {stage})",
        ).check()
        made[key] = (workdir, stopped, rank_logs(logs))
        return made[key]

    return get


CASES = [(b, s) for b in BACKENDS for s in STAGES]


@pytest.mark.parametrize(
    ("backend", "stage"), CASES, ids=[f"{b}-{s}" for b, s in CASES]
)
def test_stop_restart_and_freeze(sharded, backend, stage):
    workdir, stopped, by_rank = sharded(backend, stage)
    models = workdir / "models"
    final = models / f"model.ckpt-{stopped + 2}.pt"
    for rank in (0, 1):
        assert resumed_from(by_rank[rank], workdir) == [
            (models / f"model.ckpt-{stopped}.pt").resolve()
        ], by_rank[rank][-2000:]
        assert "Traceback" not in by_rank[rank]
    assert_committed(final, step=stopped + 2, family="model.ckpt")
    # the optimizer went on from the checkpoint's state (afresh it would be 2 or 3)
    assert adam_step(final) >= stopped + 2
    assert adam_step(final) > adam_step(models / f"model.ckpt-{stopped}.pt")
    assert lock_files(workdir) == []
    assert stray_files(workdir) == []
    frozen = run(dp("freeze", "-c", "models", "-o", "frozen", backend=backend), workdir)
    assert f"freezing {final.relative_to(workdir)}" in frozen.check().output
    assert (workdir / f"frozen{FROZEN[backend]}").is_file()


def test_a_restart_that_changes_stage_goes_on(base, sharded):
    """Stage 1 records the optimizer state by position, FSDP2 by name."""
    source, stopped, _ = sharded("pt", 1)
    workdir = copy_tree(source, base / "pt_stage1_to_3")
    write_config(workdir / "input.json", config(3, stopped + 4))
    logs = workdir / "cross_logs"
    run(
        torchrun(2, logs, "train", "input.json", "--restart", "latest", backend="pt"),
        workdir,
        label="torchrun 2 x dp --pt train --restart latest (stage 1 -> 3)",
    ).check()
    models = workdir / "models"
    final = models / f"model.ckpt-{stopped + 4}.pt"
    assert_committed(final, step=stopped + 4, family="model.ckpt")
    assert adam_step(final) > adam_step(models / f"model.ckpt-{stopped + 2}.pt")
    keys = load_payload(final)["optimizer"]["param_groups"][0]["params"]
    assert all(isinstance(k, str) for k in keys)  # FSDP2's form, by name


def test_a_sharded_checkpoint_restarts_in_one_process(base, sharded):
    """``dp --pt-expt``: stage 2 records the state by name, one process by position."""
    source, stopped, _ = sharded("pt-expt", 2)
    workdir = copy_tree(source, base / "pt_expt_stage2_to_0")
    write_config(workdir / "input.json", config(0, stopped + 4))
    run(
        dp("train", "input.json", "--restart", "latest", backend="pt-expt"), workdir
    ).check()
    models = workdir / "models"
    final = models / f"model.ckpt-{stopped + 4}.pt"
    assert_committed(final, step=stopped + 4, family="model.ckpt")
    assert adam_step(final) > adam_step(models / f"model.ckpt-{stopped + 2}.pt")
    keys = load_payload(final)["optimizer"]["param_groups"][0]["params"]
    assert all(isinstance(k, int) for k in keys)  # by position


def test_plain_deepmd_restarts_a_sharded_checkpoint_in_one_process(base, sharded):
    """The payload stays deepmd-kit's: plain deepmd-kit continues it (stage 2 to one process)."""
    source, stopped, _ = sharded("pt", 2)
    workdir = copy_tree(source, base / "pt_stage2_plain")
    write_config(workdir / "input.json", config(0, stopped + 4))
    latest = workdir / "models" / f"model.ckpt-{stopped + 2}.pt"
    result = run(
        dp("train", "input.json", "--restart", latest, backend="pt"),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
        label="DP_CKPT_DISABLE=1 dp --pt train --restart <stage-2 checkpoint>",
    ).check()
    assert resumed_from(result.output, workdir) == [latest.resolve()]
    assert (workdir / "models" / f"model.ckpt-{stopped + 4}.pt").is_file()
