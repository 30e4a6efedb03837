"""Helpers for the end-to-end tests that run the real ``dp`` command.

Everything here works from the repository checkout and the Python that runs
the tests: ``dp`` and ``torchrun`` are looked up next to ``sys.executable``, the
example input and data generator under ``examples/``. Each command is run in a
subprocess with one thread per process, timed, and its wall time printed (run
pytest with ``-s`` to see it) and kept in :data:`TIMINGS`. A ``dp`` command
starts from a fork of :mod:`dp_fork_server`, which has imported torch and the
libraries deepmd-kit builds on (not deepmd-kit, not the plugin), unless
``DP_CKPT_TESTS_FORK_SERVER=0`` asks for a fresh interpreter each time;
commands that are signalled, and ``torchrun``'s ranks, always start fresh.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port, needs_torch

from dp_ckpt_plugin.checkpoint.digests import digest_of

REPO_ROOT = Path(__file__).resolve().parents[1]
"""Root of the repository checkout."""

EXAMPLES = REPO_ROOT / "examples"
"""The example input and data generator."""

BIN_DIR = Path(sys.executable).parent
"""Directory holding the console scripts of the environment running the tests."""

DP = BIN_DIR / "dp"
"""deepmd-kit's command line."""

E2E_MARKS = [
    pytest.mark.e2e,
    needs_torch,
    pytest.mark.skipif(not DP.exists(), reason=f"no dp command at {DP}"),
]
"""The marks of a module of end-to-end tests (``pytestmark = E2E_MARKS``)."""

TORCHRUN = BIN_DIR / "torchrun"
"""PyTorch's distributed launcher."""

DEFAULT_TIMEOUT = 300.0
"""Seconds after which a command is killed and the test fails."""

TIMINGS: list[tuple[str, float]] = []
"""``(label, seconds)`` of every command run so far, in order."""

RESUMING = re.compile(r"Resuming from (\S+?)\.?$", re.MULTILINE)
"""deepmd-kit's log line naming the checkpoint a run restarts from."""

SAVED = re.compile(r"saved step (?P<step>\d+): (?P<path>\S+?),? ")
"""The plugin's one log line per save: step and the periodic family's file."""

SAVE_LINE = re.compile(
    r"saved step \d+: \S+( \+ \S+)*, [0-9.]+ [kMG]?B in [0-9.]+ s"
    r"( in the background \(training paused [0-9.?]+ s\))?, [0-9.]+ MB/s"
)
"""The whole save line: files, size, seconds, MB/s."""

_TEMP = re.compile(r"\.tmp")
_ALLOWED_DOT_FILES = re.compile(r"^\.(dp_ckpt\.store\.json|.+\.commit\.json)$")
"""Dot files a store keeps after a run: commit records (no lock, no holder)."""


@dataclass
class Result:
    """The outcome of one command.

    Attributes
    ----------
    label : str
        What was run, for messages.
    args : list of str
        The command line.
    cwd : Path
        Its working directory.
    returncode : int
        Its exit status.
    stdout, stderr : str
        Its output (deepmd-kit logs to stderr).
    seconds : float
        Its wall time.
    """

    label: str
    args: list[str]
    cwd: Path
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        """Standard output and standard error together."""
        return self.stdout + "\n" + self.stderr

    def describe(self) -> str:
        """A summary for assertion messages: the command, status and output tail."""
        tail = "\n".join(self.output.strip().splitlines()[-40:])
        ranks = ""
        for arg in self.args:  # torchrun's ranks write their output to files
            if arg.startswith("--log-dir="):
                for rank, text in rank_logs(
                    self.cwd / arg[len("--log-dir=") :]
                ).items():
                    last = "\n".join(text.strip().splitlines()[-25:])
                    ranks += f"\nrank {rank}'s last output:\n{last}"
        return (
            f"{self.label} in {self.cwd} exited {self.returncode} "
            f"after {self.seconds:.1f} s; last output:\n{tail}{ranks}"
        )

    def check(self) -> Result:
        """Assert that the command succeeded; return ``self``."""
        assert self.returncode == 0, self.describe()
        return self


def dp_env(**extra: str) -> dict[str, str]:
    """Return the environment for a ``dp`` subprocess.

    One thread per process (which also silences deepmd-kit's advice about
    threads), a fixed inference batch size, no GPU, and the plugin on unless
    ``extra`` turns it off.

    Parameters
    ----------
    **extra : str
        Variables to set on top, such as ``DP_CKPT_DISABLE="1"``.

    Returns
    -------
    dict
        A copy of ``os.environ`` with those changes.
    """
    env = dict(os.environ)
    env.pop("DP_CKPT_DISABLE", None)
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(
        OMP_NUM_THREADS="1",
        DP_INTRA_OP_PARALLELISM_THREADS="1",
        DP_INTER_OP_PARALLELISM_THREADS="1",
        DP_INFER_BATCH_SIZE="1024",
        CUDA_VISIBLE_DEVICES="",
        PYTHONFAULTHANDLER="1",  # a rank that aborts says so in its log
    )
    env.update(extra)
    return env


def run(
    args: Sequence[str | os.PathLike],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    label: str | None = None,
) -> Result:
    """Run a command, time it and print the time.

    Parameters
    ----------
    args : sequence of str or path
        The command line; a first element of :data:`DP` or :data:`TORCHRUN` is
        shown by its name.
    cwd : Path
        Working directory.
    env : mapping, optional
        Environment; :func:`dp_env` by default.
    timeout : float
        Seconds before the command is killed (the test then fails).
    label : str, optional
        Name in the printed timing; the command line by default.

    Returns
    -------
    Result
    """
    argv = [str(a) for a in args]
    shown = " ".join([Path(argv[0]).name, *argv[1:]])
    label = label or shown
    env = dict(env) if env is not None else dp_env()
    start = time.monotonic()
    server = fork_server(env) if argv[0] == str(DP) else None
    if server is not None:
        proc = server.run(argv, cwd, env, timeout)
    else:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    seconds = time.monotonic() - start
    TIMINGS.append((f"{label}  [{cwd.name}]", seconds))
    print(f"\n[e2e] {seconds:6.1f} s  {label}  (in {cwd.name}, exit {proc.returncode})")
    return Result(label, argv, cwd, proc.returncode, proc.stdout, proc.stderr, seconds)


FORK_SERVER = os.environ.get("DP_CKPT_TESTS_FORK_SERVER", "1") != "0"
"""Whether ``dp`` commands start from :mod:`dp_fork_server` (``0``: each from a
fresh interpreter)."""

#: What an interpreter reads at its start: a server serves a command only
#: when these agree.
_STARTUP = re.compile(r"^(PYTHON|LD_)")


class ForkServer:
    """A running :mod:`dp_fork_server`, for commands whose start agrees with it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="dp-fork-"))
        self.socket = self.folder / "server.sock"
        self.startup = startup_of(env)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("dp_fork_server.py")),
                str(self.socket),
            ],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the dp fork server did not start")

    def run(
        self, argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` in a fork of the server, as ``subprocess.run`` would."""
        import socket
        import uuid

        stdout = self.folder / f"{uuid.uuid4().hex}.out"
        stderr = stdout.with_suffix(".err")
        request = {
            "argv": argv,
            "cwd": str(cwd),
            "env": dict(env),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(self.socket))
            connection.sendall(json.dumps(request).encode() + b"\n")
            reader = connection.makefile("rb")
            pid = _answer(reader.readline(), "pid", argv)
            connection.settimeout(timeout)
            try:
                line = reader.readline()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout) from None
        returncode = _answer(line, "returncode", argv)
        out = stdout.read_text("utf-8", "replace")
        err = stderr.read_text("utf-8", "replace")
        stdout.unlink()
        stderr.unlink()
        return subprocess.CompletedProcess(argv, returncode, out, err)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _answer(line: bytes, key: str, argv: list[str]) -> int:
    """``key`` of the server's answer; an answer cut short says so in one line."""
    if not line:
        raise RuntimeError(f"the dp fork server gave no {key} for {' '.join(argv)}")
    return json.loads(line)[key]


def startup_of(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if _STARTUP.match(k)}


_SERVERS: list[ForkServer] = []


def fork_server(env: Mapping[str, str]) -> ForkServer | None:
    """The server for a ``dp`` command in ``env``, started at first use; ``None``
    when commands start from fresh interpreters or ``env`` starts otherwise."""
    if not FORK_SERVER:
        return None
    if not _SERVERS:
        import atexit

        _SERVERS.append(ForkServer(dp_env()))
        atexit.register(_SERVERS[0].stop)
    server = _SERVERS[0]
    return server if startup_of(env) == server.startup else None


def dp(*args: str | os.PathLike, backend: str = "pt-expt") -> list[str]:
    """Return the command line ``dp --<backend> <args>`` (``--pt-expt`` by default)."""
    return [str(DP), f"--{backend}", *map(str, args)]


def make_data(out: Path, frames: int = 12) -> Path:
    """Write the example training and validation systems with few frames.

    Parameters
    ----------
    out : Path
        Directory to hold ``train/`` and ``valid/``.
    frames : int
        Number of training frames.

    Returns
    -------
    Path
        ``out``.
    """
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "make_data.py"),
            "--out",
            str(out),
            "--frames",
            str(frames),
        ],
        check=True,
        capture_output=True,
    )
    return out


def example_config(
    *, dp_ckpt: Mapping[str, Any] | None = None, **training: Any
) -> dict[str, Any]:
    """Return the example input with changes to its ``training`` section.

    Parameters
    ----------
    dp_ckpt : mapping, optional
        Options to set in ``training._dp_ckpt``.
    **training : Any
        Keys of ``training`` to set; a value of ``None`` removes the key.

    Returns
    -------
    dict
        A fresh copy; its data systems are ``data/train`` and ``data/valid``.
    """
    config = json.loads((EXAMPLES / "input.json").read_text("utf-8"))
    config = copy.deepcopy(config)
    for key, value in training.items():
        if value is None:
            config["training"].pop(key, None)
        else:
            config["training"][key] = value
    if dp_ckpt is not None:
        config["training"]["_dp_ckpt"] = {
            **config["training"].get("_dp_ckpt", {}),
            **dp_ckpt,
        }
    return config


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a training input as JSON; return its path."""
    path.write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return path


def make_workdir(
    parent: Path, name: str, data: Path, config: Mapping[str, Any] | None = None
) -> Path:
    """Create a working directory holding a copy of ``data`` and ``input.json``.

    Parameters
    ----------
    parent : Path
        Where to create it.
    name : str
        Its name.
    data : Path
        The directory written by :func:`make_data`; copied to ``<workdir>/data``.
    config : mapping, optional
        Written to ``input.json`` if given.

    Returns
    -------
    Path
        The new directory.
    """
    workdir = parent / name
    workdir.mkdir(parents=True)
    shutil.copytree(data, workdir / "data")
    if config is not None:
        write_config(workdir / "input.json", config)
    return workdir


def copy_tree(source: Path, target: Path) -> Path:
    """Copy a directory keeping symlinks as symlinks; return ``target``."""
    shutil.copytree(source, target, symlinks=True)
    return target


SHARED_FRAMES = 8
"""Training frames of the data of the shared trainings."""

SHARED_TRAINING = {
    "numb_steps": 10,
    "save_freq": 5,
    "disp_freq": 5,
    "max_ckpt_keep": 2,
    "save_dir": "models",
}
"""The ``training`` keys of the shared trainings, on top of ``examples/input.json``:
``models/model.ckpt-{5,10}.pt``, no EMA."""


def shared_config() -> dict[str, Any]:
    """The input of the shared trainings (:data:`SHARED_TRAINING`)."""
    return example_config(**SHARED_TRAINING)


def shared_training(root: Path, backend: str) -> Path:
    """The working directory of the shared training of ``backend`` under ``root``.

    ``dp --<backend> train`` of :func:`shared_config` on :data:`SHARED_FRAMES`
    frames runs once per ``root``: the first caller trains while holding a lock
    file, every later one (in this process or another worker of the run) waits
    for that lock and takes what was trained. A failed training is tried again
    by the next caller. Tests never change this directory: they work on a copy
    (the ``trained_copy`` fixture).

    Parameters
    ----------
    root : Path
        A directory of the test run that its workers share.
    backend : str
        ``"pt"`` or ``"pt-expt"``.

    Returns
    -------
    Path
        The working directory: ``data/``, ``input.json``, ``models/`` and
        deepmd-kit's pointer and alias beside them.
    """
    from filelock import FileLock

    workdir = root / f"trained_{backend}"
    done = root / f"trained_{backend}.done"
    with FileLock(str(root / f"trained_{backend}.lock")):
        if done.exists():
            return workdir
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(root / f"data_{backend}", ignore_errors=True)
        data = make_data(root / f"data_{backend}", frames=SHARED_FRAMES)
        make_workdir(root, workdir.name, data, shared_config())
        run(
            dp("train", "input.json", backend=backend),
            workdir,
            label=f"dp --{backend} train input.json (shared)",
        ).check()
        done.write_text("trained\n", "utf-8")
    return workdir


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def steps(directory: Path, prefix: str, suffix: str = ".pt") -> list[int]:
    """Steps of the numbered files ``<prefix>-<step><suffix>`` in ``directory``.

    Aliases, records and temporary files do not match.
    """
    pattern = re.compile(re.escape(prefix) + r"-(0|[1-9][0-9]*)" + re.escape(suffix))
    found = []
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match and path.is_file() and not path.is_symlink():
            found.append(int(match.group(1)))
    return sorted(found)


def record_of(checkpoint: Path) -> dict[str, Any] | None:
    """The commit record of a checkpoint, or ``None`` if it has none."""
    path = checkpoint.parent / f".{checkpoint.name}.commit.json"
    if not path.exists():
        return None
    return json.loads(path.read_text("utf-8"))


def records_in(directory: Path) -> list[str]:
    """Names of the checkpoints that have a commit record in ``directory``."""
    return sorted(
        p.name[1 : -len(".commit.json")] for p in directory.glob(".*.commit.json")
    )


def assert_committed(checkpoint: Path, *, step: int, family: str) -> None:
    """Assert that ``checkpoint`` has a commit record matching its bytes."""
    record = record_of(checkpoint)
    assert record is not None, f"{checkpoint} has no commit record"
    assert record["name"] == checkpoint.name
    assert record["step"] == step
    assert record["family"] == family
    assert record["format"] == "torch"
    assert record["size"] == checkpoint.stat().st_size
    algorithm, _, value = record["digest"].partition(":")
    assert (
        algorithm == "blake3" and value == digest_of(checkpoint, "blake3").split(":")[1]
    )
    assert isinstance(record["format_version"], int)


def tree_state(directory: Path) -> dict[str, tuple[str, str]]:
    """What a directory holds: each entry's kind and content digest or link target.

    Parameters
    ----------
    directory : Path
        Walked recursively, dot files included.

    Returns
    -------
    dict
        Relative path to ``("link", target)``, ``("file", sha256)`` or
        ``("dir", "")``.
    """
    state = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            state[name] = ("link", os.readlink(path))
        elif path.is_dir():
            state[name] = ("dir", "")
        else:
            state[name] = ("file", sha256(path))
    return state


def read_pointer(path: Path) -> str:
    """The one line a pointer file holds."""
    return path.read_text("utf-8").strip()


def stray_files(root: Path) -> list[Path]:
    """Files under ``root`` that look temporary, or are unexpected dot files.

    Temporary files of the plugin are ``.<name>.tmp-<pid>-<random>``; deepmd-kit
    uses ``<name>.tmp``. The only dot files a store keeps after a run are
    commit records and its manifest: the lock and its holder note are removed
    when a run ends (or fails to start).
    """
    stray = []
    for path in root.rglob("*"):
        if path.is_relative_to(root / "data"):
            continue
        name = path.name
        if _TEMP.search(name) or (
            name.startswith(".") and not _ALLOWED_DOT_FILES.match(name)
        ):
            stray.append(path)
    return stray


def load_payload(path: Path) -> dict[str, Any]:
    """``torch.load`` a checkpoint safely (``weights_only=True``) on the CPU."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def payload_step(path: Path) -> int:
    """``train_infos.step`` of a checkpoint's model state."""
    return int(load_payload(path)["model"]["_extra_state"]["train_infos"]["step"])


def payload_structure(path: Path) -> dict[str, list[str]]:
    """The key structure of a checkpoint: what deepmd-kit reads back.

    Returns
    -------
    dict
        Sorted keys of the top level, the model state dict, its
        ``_extra_state`` and ``train_infos``, and of the optimizer and EMA
        states where present.
    """
    payload = load_payload(path)
    model = payload["model"]
    extra = model["_extra_state"]
    structure = {
        # the plugin's entry (exact resume) is a key deepmd-kit does not read
        "top": sorted(key for key in payload if key != "_dp_ckpt"),
        "model": sorted(model),
        "model_params": sorted(extra.get("model_params", {})),
        "extra_state": sorted(extra),
        "train_infos": sorted(extra["train_infos"]),
    }
    if "optimizer" in payload:
        structure["optimizer"] = sorted(payload["optimizer"])
    if "ema" in payload:
        structure["ema"] = sorted(payload["ema"])
    return structure


def resumed_from(text: str, cwd: Path) -> list[Path]:
    """Every checkpoint a log says it resumed from, resolved against ``cwd``."""
    return [(cwd / m).resolve() for m in RESUMING.findall(text)]


def assert_no_traceback(result: Result) -> None:
    """Assert that neither output stream holds a Python traceback."""
    assert "Traceback (most recent call last)" not in result.output, result.describe()


def torchrun(
    nproc: int, log_dir: Path, *args: str | os.PathLike, backend: str = "pt-expt"
) -> list[str]:
    """``torchrun`` running ``dp --<backend> <args>`` on ``nproc`` local ranks.

    Each rank's output goes to its own files under ``log_dir`` (see
    :func:`rank_logs`).
    """
    return [
        str(TORCHRUN),
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        f"--log-dir={log_dir}",
        "--redirects=3",
        *dp(*args, backend=backend),
    ]


FATAL = "Fatal Python error"
"""What a process says when it dies of a signal such as SIGABRT (faulthandler)."""


def assert_no_rank_died(logs: dict[int, str]) -> None:
    """No rank of a ``torchrun`` died of a fatal signal (its exit status may hide it)."""
    died = {
        rank: text[text.index(FATAL) :][:2000]
        for rank, text in logs.items()
        if FATAL in text
    }
    assert not died, died


def rank_logs(log_dir: Path) -> dict[int, str]:
    """The stdout and stderr of each rank that torchrun wrote under ``log_dir``."""
    logs: dict[int, str] = {}
    for path in sorted(log_dir.rglob("*.log")):
        if path.parent.name.isdigit():
            rank = int(path.parent.name)
            logs[rank] = logs.get(rank, "") + path.read_text("utf-8", "replace")
    return logs


def frozen_variables(path: Path) -> dict[str, Any]:
    """The model variables a frozen ``.pte`` archive carries, by their path.

    deepmd-kit stores the serialized model (``extra/model.json``) in the
    archive; its variables are the weights and statistics of the checkpoint
    that was frozen.

    Returns
    -------
    dict
        ``/model/.../@variables/<name>`` to a numpy array.
    """
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("/extra/model.json")]
        serialized = json.loads(archive.read(name))
    found: dict[str, Any] = {}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("@class") == "np.ndarray" and "value" in node:
                found[where] = np.asarray(node["value"], dtype=node.get("dtype"))
                return
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    walk(serialized, "")
    return found


def unmatched_variables(frozen: Path, checkpoint: Path) -> list[str]:
    """Variables of a frozen model that no tensor of a checkpoint equals exactly.

    An empty list means the frozen model was made from that checkpoint's
    weights (values are compared bit for bit; JSON keeps doubles exactly).

    Parameters
    ----------
    frozen : Path
        A ``.pte`` file written by ``dp --pt-expt freeze``.
    checkpoint : Path
        A training checkpoint.

    Returns
    -------
    list of str
        Paths of the variables without an equal tensor in the checkpoint.
    """
    import numpy as np

    tensors = [
        value.detach().cpu().numpy()
        for key, value in load_payload(checkpoint)["model"].items()
        if key != "_extra_state" and hasattr(value, "detach")
    ]
    variables = frozen_variables(frozen)
    assert variables, f"{frozen} carries no model variables"
    return [
        where
        for where, array in variables.items()
        if not any(t.shape == array.shape and np.array_equal(t, array) for t in tensors)
    ]


ENERGY_RMSE = re.compile(r"Energy RMSE\s*:\s*(\S+) eV")
"""``dp test``'s energy RMSE line."""


def saved_steps(text: str) -> list[tuple[str, int]]:
    """``(file name, step)`` of each save line of a log, in order."""
    return [(Path(m["path"]).name, int(m["step"])) for m in SAVED.finditer(text)]


def lock_files(directory: Path) -> list[str]:
    """The lock and holder files under ``directory`` (none after a run ends)."""
    names = (".dp_ckpt.lock", ".dp_ckpt.holder.json")
    return sorted(str(p) for p in directory.rglob("*") if p.name in names)


def dp_as_version(version: str, *args: str | os.PathLike) -> list[str]:
    """Run deepmd-kit's ``dp`` main as if deepmd-kit were ``version``.

    The console script ``dp`` is ``deepmd.main.main``; here the same main runs
    after ``deepmd.__version__`` is set, before ``deepmd.backend`` loads the
    plugin's entry point, so the version guard sees ``version``.
    """
    code = (
        "import sys, deepmd\n"
        f"deepmd.__version__ = {version!r}\n"
        "from deepmd.main import main\n"
        "sys.argv[0] = 'dp'\n"
        "sys.exit(main())\n"
    )
    return [sys.executable, "-c", code, "--pt-expt", *map(str, args)]


def start(
    args: Sequence[str | os.PathLike],
    cwd: Path,
    log: Path,
    *,
    session: bool = False,
    **extra_env: str,
) -> subprocess.Popen:
    """Start a command in the background, its output going to ``log``.

    With ``session``, in a process group of its own, as a terminal starts a
    foreground job (:func:`signal_group` signals it as a terminal does), with
    ``SIGINT`` at its default action (not ignored, as for a background job).
    """
    handle = open(log, "w")  # noqa: SIM115 - closed by the child's exit
    return subprocess.Popen(
        [str(a) for a in args],
        cwd=cwd,
        env=dp_env(**extra_env),
        stdout=handle,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=session,
        preexec_fn=_default_sigint if session else None,
    )


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the process group of ``proc`` (started with ``session``),
    as a terminal's Ctrl-C, ``kill -TERM -<pgid>`` or a scheduler does."""
    os.killpg(proc.pid, signum)


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 240):
    """Wait until ``log`` matches ``pattern``; fail if the process ends first."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text("utf-8", "replace") if log.exists() else ""
        found = regex.search(text)
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(
                f"exited {proc.returncode} before logging {pattern!r}:\n{text[-3000:]}"
            )
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in {log} after {timeout} s")


def lcurve_rows(workdir: Path) -> dict[int, str]:
    """The rows of ``lcurve.out`` by step (headers, repeated at a restart, left out)."""
    found = {}
    for line in (workdir / "lcurve.out").read_text("utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            found[int(line.split()[0])] = line
    return found


def payload_tensors(path: Path) -> dict[str, object]:
    """Every tensor of a checkpoint's model and optimizer state, by key path."""
    import torch

    flat = {}

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}/{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{where}/{index}")
        elif isinstance(value, torch.Tensor):
            flat[where] = value

    payload = load_payload(path)
    walk(payload["model"], "model")
    walk(payload.get("optimizer"), "optimizer")
    return flat


def assert_same_tensors(first: Path, second: Path) -> None:
    import torch

    a, b = payload_tensors(first), payload_tensors(second)
    assert a.keys() == b.keys()
    differ = [key for key in a if not torch.equal(a[key], b[key])]
    assert not differ, f"{len(differ)} of {len(a)} tensors differ, first {differ[:3]}"
