"""End to end: where a checkpoint came from, and an honest restart (issue 33), both hosts.

For ``dp --pt`` and ``dp --pt-expt``, with the real ``dp``: a run of 10
steps (a checkpoint every 5); ``--restart`` from step 5 with the same input
says the resume is exact; then ``training.numb_steps`` raised to 14 and
``--restart latest`` says the resume at step 10 is not exact and why. Every
record names its origin and the store keeps each input once. On those real
checkpoints: ``dp-ckpt show``, ``diff`` and ``check``, for people and in
their JSON forms (``docs/command.md``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    copy_tree,
    dp,
    dp_env,
    example_config,
    make_data,
    make_workdir,
    run,
    write_config,
)

from dp_ckpt_plugin.checkpoint.records import read_record

pytestmark = E2E_MARKS

BACKENDS = ("pt", "pt-expt")
EXACT = re.compile(r"exact resume at step (\d+): random generators and data position")
NOT_EXACT = re.compile(r"resume at step (\d+) is not exact: (.+?); the batches")
NUMB_STEPS = (
    "training.numb_steps 10 -> 14, the learning-rate schedule and loss "
    "prefactors follow numb_steps"
)


def config(numb_steps: int = 10):
    return example_config(numb_steps=numb_steps, save_freq=5, disp_freq=5, seed=7)


def train(workdir: Path, backend: str, *args: str) -> str:
    argv = dp("train", "input.json", "--skip-neighbor-stat", *args, backend=backend)
    return run(argv, workdir).check().output


def dp_ckpt(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dp_ckpt_plugin", *args],
        cwd=workdir,
        env=dp_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(backend)``: the work directory and the logs of the three runs."""
    base = tmp_path_factory.mktemp("e2e_provenance")
    data = make_data(base / "data_source", frames=6)
    made: dict[str, tuple[Path, list[str]]] = {}

    def make(backend: str) -> tuple[Path, list[str]]:
        if backend not in made:
            workdir = make_workdir(base, backend, data, config())
            logs = [train(workdir, backend)]
            logs.append(train(workdir, backend, "--restart", "models/model.ckpt-5.pt"))
            write_config(workdir / "input.json", config(14))
            logs.append(train(workdir, backend, "--restart", "latest"))
            made[backend] = workdir, logs
        return made[backend]

    return make


@pytest.mark.parametrize("backend", BACKENDS)
def test_nothing_changed_is_exact_and_numb_steps_changed_is_not(runs, backend):
    workdir, (_, same, raised) = runs(backend)
    assert EXACT.findall(same) == ["5"], same[-3000:]
    assert not NOT_EXACT.search(same)
    assert not EXACT.search(raised)
    assert NOT_EXACT.findall(raised) == [("10", NUMB_STEPS)], raised[-3000:]
    assert f"changed since step 10: {NUMB_STEPS}" in raised
    # every record names its origin; each distinct input is kept once
    host = backend.replace("-", "_")
    origins = {}
    for step in (10, 14):
        record = read_record(workdir / "models" / f"model.ckpt-{step}.pt")
        origin = record.provenance
        assert origin.backend == host and origin.world_size == 1 and origin.seed == 7
        assert origin.deepmd_kit == "3.2.0" and origin.torch and origin.plugin
        assert [(s.role, s.path) for s in origin.data.systems] == [
            ("training", "data/train"),
            ("validation", "data/valid"),
        ]
        origins[step] = origin
    assert origins[10].data == origins[14].data
    assert origins[10].input != origins[14].input
    kept = sorted(p.name for p in (workdir / "models" / "inputs").iterdir())
    assert len(kept) == 2


def test_show_diff_and_check_on_real_checkpoints(runs):
    workdir, _ = runs("pt-expt")
    shown = json.loads(dp_ckpt(workdir, "show", "models", "--json").stdout)
    assert shown["step"] == 14 and shown["provenance"]["backend"] == "pt_expt"
    assert shown["input"]["training"]["numb_steps"] == 14
    people = dp_ckpt(workdir, "show", "models", "--input").stdout
    assert "backend" in people and '"numb_steps": 14' in people

    found = dp_ckpt(workdir, "diff", "models/model.ckpt-10.pt", "models", "--json")
    assert found.returncode == 0, found.stderr
    diff = json.loads(found.stdout)
    assert [c["key"] for c in diff["input"]["changes"]] == ["training.numb_steps"]
    assert [c["field"] for c in diff["provenance"]["changes"]] == ["input"]
    tensors = {e["key"]: e for e in diff["tensors"]["entries"]}
    weights = [
        e for k, e in tensors.items() if k.startswith("/model/") and e["shape_a"]
    ]
    assert weights and all(e["shape_a"] == e["shape_b"] for e in weights)
    moved = [e for e in weights if e["status"] == "changed"]
    assert moved and all(e["max_abs_diff"] > 0 and e["rel_norm"] > 0 for e in moved)
    against_input = json.loads(
        dp_ckpt(workdir, "diff", "models", "input.json", "--json").stdout
    )
    assert against_input["input"]["changes"] == []
    assert against_input["tensors"]["compared"] is False

    ok = dp_ckpt(workdir, "check", "input.json", "--restart", "latest", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    verdict = json.loads(ok.stdout)
    assert verdict["will_load"] is True and verdict["checkpoint"]["step"] == 14
    other = config(20)
    other["model"]["descriptor"]["neuron"] = [4, 16]
    write_config(workdir / "other.json", other)
    before = sorted(p.name for p in (workdir / "models").rglob("*"))
    bad = dp_ckpt(workdir, "check", "other.json", "--restart", "latest")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "will not load" in bad.stdout and "model.descriptor.neuron" in bad.stdout
    assert "training.numb_steps" in bad.stdout
    tuned = dp_ckpt(workdir, "check", "other.json", "--finetune", "models", "--json")
    assert tuned.returncode == 0 and json.loads(tuned.stdout)["model_changes"]
    missing = dp_ckpt(workdir, "check", "input.json", "--init-model", "nothere")
    assert missing.returncode == 1 and "will not load" in missing.stdout
    # check writes nothing in the store
    assert sorted(p.name for p in (workdir / "models").rglob("*")) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_system_added_restores_no_data_position_and_says_why(runs, backend):
    source, _ = runs(backend)
    workdir = copy_tree(source, source.parent / f"{backend}_more_data")
    shutil.copytree(workdir / "data" / "train", workdir / "data" / "more")
    more = config(16)
    more["training"]["training_data"]["systems"] = ["data/train", "data/more"]
    write_config(workdir / "input.json", more)
    out = train(workdir, backend, "--restart", "latest")
    assert (
        "changed since step 14: training system data/more added: the data "
        "position cannot be restored" in out
    ), out[-3000:]
    assert NOT_EXACT.findall(out) == [("14", "the data changed since the checkpoint")]
    assert "(2 changes of the input, above)" in out
    origin = read_record(workdir / "models" / "model.ckpt-16.pt").provenance
    assert [s.path for s in origin.data.systems] == [
        "data/train",
        "data/more",
        "data/valid",
    ]
