"""End to end: reproducible runs and exact resume (issue 19), both backends, 1 and 2 ranks.

For each backend (``dp --pt``, ``dp --pt-expt``) on one process and on two
CPU ranks (``torchrun``, gloo), with ``training.seed`` set:

``straight`` / ``again``
    Two uninterrupted runs of 20 steps (a checkpoint every 10, a row of
    ``lcurve.out`` every step) in two directories: the rows and the final
    model and optimizer tensors are identical. Plain deepmd-kit 3.2's
    ``dp --pt-expt`` differs from the first row (its ``dp_random`` is not
    seeded from ``training.seed``).
``continued``
    The first run's store as it was after the commit of step 10 (the files
    of step 20 removed, as if the run had been killed after that commit),
    continued with ``--restart latest`` to step 20: rows 11 to 20 and the
    final tensors are those of the uninterrupted run, and the restart says
    in one line that it is exact.

Also: with ``training._dp_ckpt.exact_resume`` off, the restart says it is
not exact and why; a stop signal, then ``--restart latest``, continues
exactly (``dp --pt-expt``, one process).

Run with ``pytest tests/test_e2e_exact.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    TORCHRUN,
    assert_no_rank_died,
    assert_same_tensors,
    copy_tree,
    dp,
    dp_env,
    example_config,
    load_payload,
    make_data,
    make_workdir,
    rank_logs,
    run,
    start,
    torchrun,
    wait_for,
    write_config,
)
from e2e_support import (
    lcurve_rows as rows,
)

pytestmark = E2E_MARKS

BACKENDS = ("pt", "pt-expt")
EXACT = re.compile(r"exact resume at step (\d+): random generators and data position")
NOT_EXACT = re.compile(r"resume at step (\d+) is not exact: (.+?); the batches")
STOPPED = re.compile(r"SIGTERM: stopped after step (\d+);")


def config(numb_steps: int = 20, **dp_ckpt):
    return example_config(
        numb_steps=numb_steps,
        save_freq=10,
        disp_freq=1,
        max_ckpt_keep=5,
        seed=7,
        dp_ckpt=dp_ckpt or None,
    )


def train(workdir: Path, backend: str, ranks: int, *args: str) -> str:
    """``dp train`` (or ``torchrun`` on ``ranks``) in ``workdir``; the log text."""
    argv = ["train", "input.json", "--skip-neighbor-stat", *args]
    if ranks == 1:
        return run(dp(*argv, backend=backend), workdir).check().output
    logs = workdir / "torchrun_logs"
    shutil.rmtree(logs, ignore_errors=True)
    run(torchrun(ranks, logs, *argv, backend=backend), workdir).check()
    by_rank = rank_logs(logs)
    assert_no_rank_died(by_rank)
    return "\n".join(by_rank.values())


def after_step_10(source: Path, target: Path) -> Path:
    """``source``'s run as it was after the commit of step 10 (a copy)."""
    copy_tree(source, target)
    models = target / "models"
    for path in list(models.iterdir()):
        if "-20.pt" in path.name:
            path.unlink()
    for pointer in (target / "checkpoint",):
        pointer.write_text("models/model.ckpt-10.pt\n", "utf-8")
    for alias in ("model.ckpt.pt", "model_ema.ckpt.pt"):
        link = target / alias
        if link.is_symlink():
            link.unlink()
            link.symlink_to(f"models/{alias.replace('.pt', '-10.pt')}")
    lines = (target / "lcurve.out").read_text("utf-8").splitlines(keepends=True)
    kept = [x for x in lines if x.lstrip().startswith("#") or int(x.split()[0]) <= 10]
    (target / "lcurve.out").write_text("".join(kept), "utf-8")
    shutil.rmtree(target / "torchrun_logs", ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_exact")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=6)


@pytest.fixture(scope="module")
def runs(base, data):
    """``runs(backend, ranks, name)``: the runs of the module docstring; memoized."""
    made: dict[tuple, tuple[Path, str]] = {}

    def get(backend: str, ranks: int, name: str) -> tuple[Path, str]:
        key = (backend, ranks, name)
        if key in made:
            return made[key]
        if ranks > 1 and not TORCHRUN.exists():
            pytest.skip(f"no torchrun at {TORCHRUN}")
        label = f"{backend}_{ranks}_{name}"
        if name in ("straight", "again"):
            workdir = make_workdir(base, label, data, config())
            out = train(workdir, backend, ranks)
        else:
            straight, _ = get(backend, ranks, "straight")
            workdir = after_step_10(straight, base / label)
            out = train(workdir, backend, ranks, "--restart", "latest")
        made[key] = (workdir, out)
        return made[key]

    return get


CASES = [(b, r) for r in (1, 2) for b in BACKENDS]
IDS = [f"{b}-{r}rank" for b, r in CASES]


@pytest.mark.parametrize(("backend", "ranks"), CASES, ids=IDS)
def test_two_uninterrupted_runs_are_identical(runs, backend, ranks):
    first, _ = runs(backend, ranks, "straight")
    second, _ = runs(backend, ranks, "again")
    assert sorted(rows(first)) == list(range(1, 21))
    assert rows(first) == rows(second)
    assert_same_tensors(
        first / "models" / "model.ckpt-20.pt", second / "models" / "model.ckpt-20.pt"
    )


@pytest.mark.parametrize(("backend", "ranks"), CASES, ids=IDS)
def test_a_run_stopped_at_10_and_continued_is_the_uninterrupted_run(
    runs, backend, ranks
):
    straight, _ = runs(backend, ranks, "straight")
    continued, out = runs(backend, ranks, "continued")
    assert EXACT.findall(out)[:1] == ["10"], out[-3000:]
    assert not NOT_EXACT.search(out)
    # dp --pt starts at step 11: one row per step, none done twice
    assert sorted(rows(continued)) == list(range(1, 21))
    assert rows(continued) == rows(straight)
    assert_same_tensors(
        straight / "models" / "model.ckpt-20.pt",
        continued / "models" / "model.ckpt-20.pt",
    )
    entry = load_payload(continued / "models" / "model.ckpt-20.pt")["_dp_ckpt"]
    assert entry["step"] == 20 and entry["world_size"] == ranks


def test_two_ranks_draw_different_batches(runs):
    """dp --pt-expt seeds each rank's data generator differently."""
    import torch

    straight, _ = runs("pt-expt", 2, "straight")
    entry = load_payload(straight / "models" / "model.ckpt-20.pt")["_dp_ckpt"]
    first, second = (r["rng"]["dp_random"]["keys"] for r in entry["ranks"])
    assert not torch.equal(first, second)


def test_with_exact_resume_off_the_restart_says_it_is_not_exact(runs, base):
    straight, _ = runs("pt-expt", 1, "straight")
    workdir = after_step_10(straight, base / "exact_off")
    write_config(workdir / "input.json", config(exact_resume=False))
    out = train(workdir, "pt-expt", 1, "--restart", "latest")
    assert NOT_EXACT.findall(out) == [("10", "training._dp_ckpt.exact_resume is off")]
    assert "_dp_ckpt" in load_payload(workdir / "models" / "model.ckpt-20.pt")
    assert (
        "ranks" not in load_payload(workdir / "models" / "model.ckpt-20.pt")["_dp_ckpt"]
    )


def test_a_stop_signal_then_restart_latest_continues_exactly(base, data):
    """SIGTERM at some step, ``--restart latest``: the uninterrupted run's rows."""
    steps = 300
    straight = make_workdir(base, "signal_straight", data, config(steps))
    train(straight, "pt-expt", 1)
    workdir = make_workdir(base, "signal_stopped", data, config(steps))
    log = workdir / "train.log"
    proc = start(
        dp("train", "input.json", "--skip-neighbor-stat", backend="pt-expt"),
        workdir,
        log,
    )
    try:
        wait_for(log, r"saved step 10:", proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    (stopped,) = map(int, STOPPED.findall(log.read_text("utf-8")))
    assert 10 <= stopped < steps
    out = train(workdir, "pt-expt", 1, "--restart", "latest")
    assert EXACT.findall(out) == [str(stopped)]
    assert rows(workdir) == rows(straight)
    assert_same_tensors(
        straight / "models" / f"model.ckpt-{steps}.pt",
        workdir / "models" / f"model.ckpt-{steps}.pt",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_of_plain_deepmd_kit_resumes_not_exactly_and_says_so(
    base, data, backend
):
    workdir = make_workdir(base, f"plain_{backend}", data, config(10))
    run(
        dp("train", "input.json", "--skip-neighbor-stat", backend=backend),
        workdir,
        env=dp_env(DP_CKPT_DISABLE="1"),
    ).check()
    assert "_dp_ckpt" not in load_payload(workdir / "models" / "model.ckpt-10.pt")
    write_config(workdir / "input.json", config(12))
    out = train(workdir, backend, 1, "--restart", "models/model.ckpt-10.pt")
    (found,) = NOT_EXACT.findall(out)
    assert found[1] == (
        "the checkpoint was written by plain deepmd-kit (it holds no random or "
        "data state)"
    )
    # what the plugin writes from there on carries the state
    assert "ranks" in load_payload(workdir / "models" / "model.ckpt-12.pt")["_dp_ckpt"]
