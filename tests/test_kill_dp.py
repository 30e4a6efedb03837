"""SIGKILL a real ``dp --pt-expt train`` mid-run and resume it with ``latest``.

Two tests run the real command on a tiny Cu/Ag data set (``examples/make_data.py``)
with ``save_freq: 1``, so a checkpoint is written at every step and a kill after
a random (seeded) delay lands anywhere in the write, commit, publish and prune
sequence:

- :func:`test_sigkill_and_restart_latest_rounds` kills a single ``dp`` round
  after round. After every kill, ``models/checkpoint`` names a committed
  checkpoint that matches its commit record, loads with
  ``torch.load(weights_only=True)`` and holds the step of its name; the pointer
  is at the last step the run logged as committed or the one after. The next
  round (``--restart latest``) logs that it resumes from exactly that file and
  commits the following steps. A last restart runs to the end: the final
  checkpoint is step ``numb_steps``, no temporary file is left, and the
  retention window holds.
- :func:`test_sigkill_torchrun_two_ranks_and_resume` does the same with two
  ranks under ``torchrun`` (gloo on CPU). Torch elastic starts each worker in
  a session of its own, so killing torchrun's process group alone would leave
  both ranks training as orphans: the test kills every process group of the
  tree and checks that all of them are gone. On restart both ranks log that
  they resume from the file the pointer named after the kill.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import DP, EXAMPLES, TORCHRUN
from helpers import free_port, is_temp, needs_torch

from dp_ckpt_plugin.checkpoint.records import read_record, verify

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.torture,
    needs_torch,
    pytest.mark.skipif(not DP.exists(), reason=f"no dp next to {sys.executable}"),
    pytest.mark.skipif(
        not Path("/proc/self/stat").exists(), reason="needs Linux /proc"
    ),
]

#: Seed of the kill delays.
SEED = 20241129
#: Kill rounds of the single-process test (one SIGKILL each).
ROUNDS = 4
#: Length of the single-process run; long enough to still be training when killed.
NUMB_STEPS = 60
#: Retention window of both tests.
MAX_KEEP = 3
#: Longest wait between the first commit of a round and its kill, in seconds
#: (a step with a checkpoint takes about 0.1 s, so 0 to 3 more steps).
MAX_DELAY = 0.3
#: Longest wait for a process to commit its first checkpoint or to finish.
TIMEOUT = 240.0
THREADS = {
    "OMP_NUM_THREADS": "1",
    "DP_INTRA_OP_PARALLELISM_THREADS": "1",
    "DP_INTER_OP_PARALLELISM_THREADS": "1",
}
COMMITTED = re.compile(r"saved step (?P<step>\d+): (?P<path>\S+?),? ")
RESUMING = re.compile(r"^(\[default(\d+)\]:)?.*Resuming from (.+)\.$", re.MULTILINE)
RESTART = ["--restart", "latest", "--skip-neighbor-stat"]


# -- the working directory -------------------------------------------------
def make_workdir(path: Path, *, numb_steps: int) -> Path:
    """Write the tiny data set and an input with a checkpoint at every step.

    Parameters
    ----------
    path : Path
        The working directory to fill.
    numb_steps : int
        Training length.

    Returns
    -------
    Path
        ``path``, holding ``data/`` and ``input.json``.
    """
    spec = importlib.util.spec_from_file_location(
        "make_data", EXAMPLES / "make_data.py"
    )
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    with contextlib.redirect_stdout(io.StringIO()):
        make_data.main(["--out", str(path / "data"), "--frames", "8"])
    config = json.loads((EXAMPLES / "input.json").read_text())
    config["training"].update(
        numb_steps=numb_steps,
        save_freq=1,
        disp_freq=10,
        save_dir="models",
        max_ckpt_keep=MAX_KEEP,
    )
    (path / "input.json").write_text(json.dumps(config, indent=1))
    return path


# -- processes -----------------------------------------------------------------
def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """Return the state, parent pid and process group of ``pid``, or ``None``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2])


def is_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def process_tree(root: int) -> dict[int, int]:
    """Map every live process descending from ``root`` (and ``root``) to its group."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[0] != "Z":
                parents[int(entry)] = (stat[1], stat[2])
    tree = {}
    for pid, (_, pgid) in parents.items():
        node = pid
        while node in parents and node != root:
            node = parents[node][0]
        if node == root:
            tree[pid] = pgid
    return tree


def command_of(pid: int) -> list[str]:
    """Return the command line of ``pid`` (empty once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


class Launched:
    """A command started in a session of its own, output to a log file.

    Parameters
    ----------
    args : list of str
        The command.
    cwd : Path
        Its working directory.
    log : Path
        Where its stdout and stderr go.
    """

    def __init__(self, args: list[str], cwd: Path, log: Path) -> None:
        self.log = log
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **THREADS},
                start_new_session=True,
            )

    def text(self) -> str:
        """Return what it logged so far."""
        return self.log.read_text(errors="replace")

    def committed_steps(self) -> list[int]:
        """Return the steps it logged as committed, in order."""
        return [int(m["step"]) for m in COMMITTED.finditer(self.text())]

    def wait_for_commit(self) -> None:
        """Wait until it logs its first commit; fail if it ends or times out."""
        deadline = time.monotonic() + TIMEOUT
        while not self.committed_steps():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.log.name}: exited with {self.proc.returncode} before "
                    f"committing anything:\n{self.text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"{self.log.name}: no commit after {TIMEOUT} s")
            time.sleep(0.02)

    def kill(self) -> dict[int, tuple[int, list[str]]]:
        """SIGKILL every process group of its process tree; wait until all are gone.

        torch elastic starts each worker with ``start_new_session=True``, so
        the workers are not in torchrun's process group: each group of the
        tree is killed. Returns the processes killed: pid to group and command.
        """
        groups = process_tree(self.proc.pid)
        groups.setdefault(self.proc.pid, self.proc.pid)
        tree = {pid: (pgid, command_of(pid)) for pid, pgid in groups.items()}
        own = os.getpgrp()
        for pgid in sorted(set(groups.values()), key=lambda g: g != self.proc.pid):
            if pgid != own:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(is_alive(pid) for pid in tree):
            if time.monotonic() > deadline:
                survivors = [pid for pid in tree if is_alive(pid)]
                pytest.fail(f"still alive after SIGKILL: {survivors}")
            time.sleep(0.02)
        return tree

    def finish(self) -> str:
        """Wait for a normal end; fail unless it exits with status 0."""
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.log.name}: did not finish in {TIMEOUT} s")
        text = self.text()
        assert self.proc.returncode == 0, f"{self.log.name}:\n{text[-3000:]}"
        return text


@pytest.fixture
def launch():
    """Start commands with :class:`Launched`; kill whatever still runs at the end."""
    started: list[Launched] = []

    def start(args: list[str], cwd: Path, log: Path) -> Launched:
        run = Launched([str(a) for a in args], cwd, log)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.kill()


# -- checks ----------------------------------------------------------------------
def check_latest(models: Path) -> tuple[Path, int]:
    """Check what ``models/checkpoint`` names; return the path and its step.

    The pointer must name a checkpoint whose commit record matches it (size
    and sha256), which ``torch.load(weights_only=True)`` reads, and whose
    ``train_infos.step`` is the step in its name.
    """
    import torch

    name = (models / "checkpoint").read_text().strip()
    match = re.fullmatch(r"model\.ckpt-(\d+)\.pt", name)
    assert match, f"models/checkpoint names {name!r}"
    step = int(match.group(1))
    path = models / name
    record = read_record(path)
    assert record is not None, f"{name} has no commit record"
    assert record.step == step
    verify(path, record, digest=True)
    state = torch.load(path, weights_only=True, map_location="cpu")
    assert state["model"]["_extra_state"]["train_infos"]["step"] == step
    # the alias in the store and the compatibility pointer and alias in the
    # working directory are published after the pointer: a kill in between
    # leaves them behind, but they always name a committed checkpoint that
    # still exists (pruning runs only after a complete publication)
    work = models.parent
    compat = work / (work / "checkpoint").read_text().strip()
    for target in (models / "model.ckpt.pt", work / "model.ckpt.pt", compat):
        real = target.resolve()
        assert real.parent == models.resolve(), target
        assert read_record(real) is not None, f"{target} -> {real}: not committed"
        assert int(real.stem.split("-")[-1]) <= step, (target, real)
    return path, step


def check_resumed(text: str, expected: Path, *, ranks: int = 1) -> None:
    """Check that every rank logged ``Resuming from`` exactly ``expected``."""
    found = RESUMING.findall(text)
    assert len(found) == ranks, f"'Resuming from' lines: {found}"
    if ranks > 1:
        assert sorted(int(rank) for _, rank, _ in found) == list(range(ranks))
    for *_, path in found:
        assert Path(path).resolve() == expected.resolve(), (path, expected)


def temporaries(*directories: Path) -> list[Path]:
    """Return the temporary files (``.tmp-`` in the name) under the directories."""
    return [
        path
        for directory in directories
        for path in directory.rglob("*")
        if ".tmp-" in path.name
    ]


def catch_temporary(directory: Path, limit: float = 3.0) -> str | None:
    """Wait (at most ``limit`` seconds) until a temporary file shows up in ``directory``.

    Returns its name, or ``None`` if none was seen: the caller kills the
    writer at once, so the kill lands inside a write (or just after it).
    """
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with os.scandir(directory) as entries:
            for entry in entries:
                if is_temp(entry.name):
                    return entry.name
        time.sleep(0.001)
    return None


def listing(directory: Path) -> list[tuple[str, int]]:
    """Return the names and modification times of the entries of ``directory``."""
    return sorted((p.name, p.lstat().st_mtime_ns) for p in directory.iterdir())


def leftovers(models: Path, pointer_step: int) -> str:
    """Describe what a kill left besides the published checkpoint, for the figures."""
    temps = len(temporaries(models))
    unrecorded = sorted(
        step
        for step in numbered(models)
        if read_record(models / f"model.ckpt-{step}.pt") is None
    )
    unpublished = sorted(step for step in numbered(models) if step > pointer_step)
    return f"{temps} temporary, unrecorded {unrecorded}, above pointer {unpublished}"


def numbered(models: Path) -> set[int]:
    """Return the steps of the numbered checkpoint files in ``models``."""
    return {
        int(m.group(1))
        for p in models.iterdir()
        if (m := re.fullmatch(r"model\.ckpt-(\d+)\.pt", p.name)) and not p.is_symlink()
    }


# -- the tests ---------------------------------------------------------------------
def test_sigkill_and_restart_latest_rounds(tmp_path, launch):
    """Kill a real ``dp --pt-expt train`` mid-run round after round; resume with ``latest``."""
    began = time.monotonic()
    rng = random.Random(SEED)
    work = make_workdir(tmp_path, numb_steps=NUMB_STEPS)
    models = work / "models"
    train = [DP, "--pt-expt", "train", "input.json"]
    resumed_from: Path | None = None
    figures = []
    for rnd in range(ROUNDS):
        args = train if resumed_from is None else [*train, *RESTART]
        run = launch(args, work, work / f"round{rnd}.log")
        run.wait_for_commit()
        delay = rng.uniform(0.0, MAX_DELAY)
        time.sleep(delay)
        # odd rounds aim the kill at a write in progress
        aimed = catch_temporary(models) if rnd % 2 else None
        assert run.proc.poll() is None, f"round {rnd} ended before it was killed"
        run.kill()

        steps = run.committed_steps()
        first = 1 if resumed_from is None else int(resumed_from.stem.split("-")[-1]) + 1
        assert steps == list(range(first, first + len(steps))), steps
        if resumed_from is not None:
            check_resumed(run.text(), resumed_from)
        latest, step = check_latest(models)
        assert steps[-1] <= step <= steps[-1] + 1, (steps, step)
        assert not (models / "quarantine").exists()
        left = leftovers(models, step)
        figures.append((rnd, first - 1, delay, aimed, steps[-1], step, left))
        resumed_from = latest

    final = launch([*train, *RESTART], work, work / "final.log")
    text = final.finish()
    check_resumed(text, resumed_from)
    first = int(resumed_from.stem.split("-")[-1]) + 1
    assert final.committed_steps() == list(range(first, NUMB_STEPS + 1))
    _, step = check_latest(models)
    assert step == NUMB_STEPS
    assert temporaries(work) == []
    assert numbered(models) == set(range(NUMB_STEPS - MAX_KEEP + 1, NUMB_STEPS + 1))
    assert not (models / "quarantine").exists()
    print(
        f"\n[kill dp] {ROUNDS} rounds, {ROUNDS} SIGKILLs, final run from step "
        f"{first - 1} to {NUMB_STEPS}, {time.monotonic() - began:.1f} s"
    )
    for rnd, start, delay, aimed, logged, pointer, left in figures:
        aim = f" (aimed: {aimed} existed)" if aimed else ""
        print(
            f"  round {rnd}: from step {start}, killed {delay:.3f} s after the first "
            f"commit{aim}; last logged commit {logged}, pointer at {pointer}; "
            f"left {left}"
        )


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun")
def test_sigkill_torchrun_two_ranks_and_resume(tmp_path, launch):
    """Kill ``torchrun`` with two ranks mid-run; both ranks resume from the same file."""
    began = time.monotonic()
    rng = random.Random(SEED + 1)
    numb_steps = 30
    work = make_workdir(tmp_path, numb_steps=numb_steps)
    models = work / "models"

    def torchrun(tag: str, *extra: str) -> Launched:
        args = [
            TORCHRUN,
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "--log-dir",
            work / f"torchrun-{tag}",
            "--tee",
            "3",
            DP,
            "--pt-expt",
            "train",
            "input.json",
            *extra,
        ]
        return launch(args, work, work / f"{tag}.log")

    run = torchrun("killed")
    run.wait_for_commit()
    time.sleep(rng.uniform(0.0, MAX_DELAY))
    assert run.proc.poll() is None, "torchrun ended before it was killed"
    tree = run.kill()
    workers = [
        pid
        for pid, (_, cmd) in tree.items()
        if pid != run.proc.pid and "--pt-expt" in cmd
    ]
    assert len(workers) == 2, f"expected two ranks under torchrun, got {tree}"
    before = listing(models)
    time.sleep(0.5)
    assert listing(models) == before, "a rank kept writing after the kill"
    latest, step = check_latest(models)

    resumed = torchrun("resumed", *RESTART)
    text = resumed.finish()
    check_resumed(text, latest, ranks=2)
    assert resumed.committed_steps() == list(range(step + 1, numb_steps + 1))
    _, final_step = check_latest(models)
    assert final_step == numb_steps
    assert temporaries(work) == []
    assert len(numbered(models)) <= MAX_KEEP
    print(
        f"\n[kill torchrun] torchrun and 2 ranks killed at step {step}; both ranks "
        f"resumed from "
        f"{latest.name} and ran to {final_step}; {time.monotonic() - began:.1f} s"
    )
