"""End to end: the real ``dp`` opens a checkpoint once and reads it once.

``dp train --restart latest``, ``dp freeze -c models`` and ``dp change-bias
models`` of both backends run under ``strace``; every opening of the
checkpoint the handle names is counted, with the bytes read through it and
any memory map of it. The front door opens it, reads it in one pass and
verifies those bytes; deepmd-kit's trainer (or freezer), the exact-resume
reader and the heads check read the same bytes from memory. (Before, a
restart opened it four times: the digest, deepmd-kit's trainer, and the
exact-resume reader's memory map, twice.)
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    dp,
    example_config,
    run,
    shared_config,
    write_config,
)

STRACE = shutil.which("strace")

pytestmark = [
    *E2E_MARKS,
    pytest.mark.skipif(STRACE is None, reason="no strace"),
]

BACKENDS = ["pt-expt", "pt"]

_CALL = re.compile(
    r"^(?P<pid>\d+)\s+(?:<\.\.\. (?P<resumed>\w+) resumed>(?P<tail>.*)|"
    r"(?P<name>\w+)\((?P<args>.*))$"
)
_RESULT = re.compile(r"=\s+(-?\d+)")


@dataclass
class Readings:
    """What a traced command did with one file."""

    openings: int = 0
    bytes_read: int = 0
    reads: int = 0
    maps: int = 0


def readings(trace: Path, name: str) -> Readings:
    """Count the openings of the file called ``name``, and the reads and maps of them.

    Calls of several threads interleave (``<unfinished ...>`` and
    ``<... read resumed>``): a call's descriptor is taken from where it began.
    """
    found = Readings()
    open_fds: set[tuple[str, str]] = set()
    pending: dict[str, tuple[str, str]] = {}
    for line in trace.read_text(errors="replace").splitlines():
        call = _CALL.match(line)
        if call is None:
            continue
        pid = call["pid"]
        if call["resumed"]:
            syscall, args = pending.pop(pid, (call["resumed"], ""))
            text = args + call["tail"]
        else:
            syscall, text = call["name"], call["args"]
            if text.endswith("<unfinished ...>"):
                pending[pid] = (syscall, text.removesuffix("<unfinished ...>"))
                continue
        result = _RESULT.search(text.rsplit(")", 1)[-1])
        value = int(result[1]) if result else -1
        if syscall in ("openat", "open"):
            quoted = re.search(r'"([^"]*)"', text)
            if quoted and Path(quoted[1]).name == name and value >= 0:
                found.openings += 1
                open_fds.add((pid, str(value)))
            continue
        first = re.match(r"\s*(-?\d+)", text)
        fd = first[1] if first else ""
        if syscall == "mmap":
            parts = [p.strip() for p in text.split(",")]
            fd = parts[4] if len(parts) > 4 else ""
        if not any(fd == f for _, f in open_fds):
            continue
        if syscall in ("read", "pread64") and value > 0:
            found.reads += 1
            found.bytes_read += value
        elif syscall == "mmap":
            found.maps += 1
        elif syscall == "close":
            open_fds = {(p, f) for p, f in open_fds if f != fd}
    return found


def traced(args: list[str], workdir: Path, trace: Path):
    """Run ``args`` under ``strace -f`` (openings, reads, maps, closes)."""
    return run(
        [
            STRACE,
            "-f",
            "-qq",
            "-e",
            "trace=open,openat,read,pread64,mmap,close",
            "-o",
            trace,
            *args,
        ],
        workdir,
        label=" ".join(["strace", *map(str, args[1:])]),
    )


@pytest.fixture
def trained(trained_copy):
    """``trained(backend, name)``: a copy in ``tmp_path / name`` of the run's
    shared training of ``backend`` (``conftest.py``): 10 steps, checkpoints at
    5 and 10."""
    assert shared_config() == example_config(numb_steps=10, save_freq=5, disp_freq=5)
    return trained_copy


def assert_read_once(trace: Path, checkpoint: Path) -> None:
    seen = readings(trace, checkpoint.name)
    assert (seen.openings, seen.maps) == (1, 0), seen
    assert seen.bytes_read == checkpoint.stat().st_size, seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_restart_reads_its_checkpoint_once(trained, backend, tmp_path):
    workdir = trained(backend, "restart")
    config = example_config(numb_steps=15, save_freq=5, disp_freq=5)
    write_config(workdir / "input.json", config)
    trace = tmp_path / "restart.trace"
    result = traced(
        dp(
            "train",
            "input.json",
            "--restart",
            "latest",
            "--skip-neighbor-stat",
            backend=backend,
        ),
        workdir,
        trace,
    ).check()
    # numb_steps 10 -> 15: continued, not exactly (the schedule follows it)
    assert "resume at step 10 is not exact: training.numb_steps 10 -> 15" in (
        result.output
    )
    assert "saved step 15" in result.output
    assert_read_once(trace, workdir / "models" / "model.ckpt-10.pt")


#: A reading command, and the file it makes in the working directory.
READERS = {
    "freeze": (["freeze", "-c", "models", "-o", "frozen"], "frozen.*"),
    "change-bias": (["change-bias", "models", "-s", "data/valid"], "*_updated.pt"),
}


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_freeze_and_change_bias_read_their_checkpoint_once(
    trained, backend, command, tmp_path
):
    workdir = trained(backend, command)
    args, made = READERS[command]
    trace = tmp_path / f"{command}.trace"
    traced(dp(*args, backend=backend), workdir, trace).check()
    assert list(workdir.glob(made)), f"{command} made nothing"
    assert_read_once(trace, workdir / "models" / "model.ckpt-10.pt")
