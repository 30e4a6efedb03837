"""What the trust tests (``test_trust_*.py``) build, run and check, in one place.

They are black-box tests: they use :class:`dp_ckpt_plugin.CheckpointManager`,
the ``dp-ckpt`` command (:func:`dp_ckpt_plugin.commands.main`), the error
classes of :mod:`dp_ckpt_plugin.errors` and files on disk, named as the README
and ``docs/command.md`` name them; no internal module of the package.

Stores
    :func:`fill` commits steps through the API; :func:`clone` copies a cached
    template store (:func:`template`), so a case costs a directory copy.
    The names of a store's files are :data:`POINTER`, :data:`MANIFEST`,
    :data:`LOCK`, :data:`HOLDER`, :func:`ckpt_name`, :func:`record_of`.
Hostile input
    :data:`HOSTILE` maps a name to a raw JSON value (bytes, written as they
    are: NaN, 10**400, 100000 levels of nesting, bytes that are not UTF-8)
    or ``None`` for "absent"; :func:`plant_json` puts one into a JSON file.
Running things
    :func:`attempt` runs an API call and says ``ok``, ``refused`` (a
    :class:`~dp_ckpt_plugin.errors.CheckpointError`) or ``crash``;
    :func:`cli` runs ``dp-ckpt`` in this process and :func:`cli_problems`
    says how its answer breaks the rules of docs/command.md (one line on
    stderr, exit status 0/1/2, strict JSON); :func:`strict_json` parses JSON
    refusing NaN and Infinity.
Probes in processes of their own
    :func:`run_probes` runs calls that may hang or eat memory (a FIFO where a
    file is expected, a link to ``/dev/zero``) each in a child forked from a
    fresh Python process (this file run as a script), with a deadline and a
    memory cap, and says what each did.
Looking at a directory
    :func:`tree_state` snapshots a tree (names, kinds, contents, mtimes,
    link targets) to compare before and after; :func:`flip_payload_byte`
    corrupts a checkpoint without changing its size.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import hashlib
import importlib
import io
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers import (
    SUFFIX,
    make_arrays,
    make_payload,
    payload_mismatches,
    plugin_manager,
)

import dp_ckpt_plugin
from dp_ckpt_plugin import CheckpointManager
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import CheckpointError

# -- names of a store's files (README, docs/command.md) --------------------------

PREFIX = "model.ckpt"
POINTER = "checkpoint"
MANIFEST = ".dp_ckpt.store.json"
LOCK = ".dp_ckpt.lock"
HOLDER = ".dp_ckpt.holder.json"
#: The steps every template store holds; the newest is the one cases attack.
STEPS = (1, 2, 3)


def ckpt_name(step, backend="hdf5"):
    """``model.ckpt-<step><suffix>``."""
    return f"{PREFIX}-{step}{SUFFIX[backend]}"


def alias_name(backend="hdf5"):
    """``model.ckpt<suffix>``, the latest alias."""
    return f"{PREFIX}{SUFFIX[backend]}"


def record_of(directory, step, backend="hdf5"):
    """The commit record of step ``step`` in ``directory``."""
    return Path(directory) / f".{ckpt_name(step, backend)}.commit.json"


def step_of(name, backend="hdf5"):
    """The step a numbered file name encodes, or ``None``."""
    head, suffix = f"{PREFIX}-", SUFFIX[backend]
    if name.startswith(head) and name.endswith(suffix):
        text = name[len(head) : -len(suffix)]
        if text.isdigit():
            return int(text)
    return None


# -- stores ---------------------------------------------------------------------


def metric_of(step):
    """The ``loss`` a template checkpoint of ``step`` carries."""
    return 1.0 / (step + 1)


def manager(directory, backend="hdf5", *, pm=None, durable=False, **kwargs):
    """A :class:`CheckpointManager` on ``directory`` without entry points.

    ``durable=False`` by default: these tests are not about fsync, and it
    keeps the generated cases fast.
    """
    return CheckpointManager(
        directory,
        format=backend,
        pm=pm or plugin_manager(),
        durable=durable,
        **kwargs,
    )


#: The policy of template stores: keep everything, and rank by ``loss`` (for ``best``).
POLICY = {"keep_last": 0, "keep_best": 1, "best_metric": "loss"}


def fill(directory, steps=STEPS, backend="hdf5", *, policy=None, **kwargs):
    """Commit the payload (and a ``loss`` metric) of each of ``steps``; close.

    The policy is :data:`POLICY` unless ``policy`` or ``max_keep`` is given.
    """
    if "max_keep" not in kwargs:
        kwargs["policy"] = policy or POLICY
    with manager(directory, backend, **kwargs) as m:
        for step in steps:
            m.save(step, make_payload(step, backend), metrics={"loss": metric_of(step)})
    return Path(directory)


def template(backend="hdf5", steps=STEPS):
    """A store holding ``steps``, made once per process (copy it with :func:`clone`)."""
    return _template(backend, tuple(steps))


@functools.cache
def _template(backend, steps):
    root = Path(tempfile.mkdtemp(prefix="dp-ckpt-trust-"))
    atexit.register(shutil.rmtree, root, True)
    return fill(root / "store", steps, backend)


def clone(dest, backend="hdf5", steps=STEPS):
    """Copy the template store of ``steps`` to ``dest``; return ``dest``.

    Contents and links only (no metadata): a copy costs a few file writes.
    """
    source = template(backend, steps)
    dest = Path(dest)
    dest.mkdir(parents=True)
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), dest / entry.name)
            else:
                shutil.copyfile(entry.path, dest / entry.name)
    return dest


# -- hostile values -------------------------------------------------------------

#: Raw JSON values written where a field's value goes (``None``: the field is absent).
#: The last three make the whole text unreadable wherever they sit.
HOSTILE = {
    "null": b"null",
    "true": b"true",
    "string": b'"seven"',
    "number": b"7",
    "negative": b"-1",
    "huge-int": b"1" + b"0" * 400,  # 10**400
    "nan": b"NaN",
    "infinity": b"Infinity",
    "1e309": b"1e309",
    "absurd-size": str(2**63).encode(),
    "empty-string": b'""',
    "long-string": b'"' + b"x" * 100_000 + b'"',
    "list": b"[1, 2]",
    "nested-dict": b'{"a": {"b": {"c": 1}}}',
    "unicode": b'"\\ud800\\u0000\\u202e\\ufeff"',
    "absent": None,
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "over-4300-digits": b"9" * 5000,
    "not-utf8": b'"\xff\xfe\xc3"',
}

#: Whole files that are not a JSON object at all.
HOSTILE_DOCUMENTS = {
    "empty-file": b"",
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "top-level-list": b"[]",
    "top-level-nan": b"NaN",
    "not-utf8": b"\xff\xfe{}",
    "truncated": b'{"name": "model',
    "huge": b'{"x": "' + b"y" * 5_000_000 + b'"}',
}

_MARK = "@@HOSTILE@@"


def plant_json(path, where, raw):
    """Rewrite the JSON object in ``path`` with ``raw`` at key path ``where``.

    ``where`` is dotted (``families.0.prefix``); a missing container on the
    way is made (a dict). ``raw`` is written as it is (bytes) or, for
    ``None``, the key is removed.
    """
    path = Path(path)
    data = json.loads(path.read_text("utf-8"))
    keys = [int(k) if k.isdigit() else k for k in where.split(".")]
    node = data
    for key in keys[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
            node[key] = {}
        node = node[key]
    if raw is None:
        if isinstance(node, list):
            del node[keys[-1]]
        else:
            node.pop(keys[-1], None)
        path.write_bytes(json.dumps(data, indent=1).encode())
        return
    node[keys[-1]] = _MARK
    text = json.dumps(data, indent=1).encode()
    path.write_bytes(text.replace(json.dumps(_MARK).encode(), raw))


# -- running things -------------------------------------------------------------


@dataclass
class Outcome:
    """What an API call did: ``ok`` (returned ``value``), ``refused`` or ``crash``."""

    kind: str
    value: object = None
    error: BaseException | None = None

    def __str__(self):
        if self.error is None:
            return f"{self.kind}: {self.value!r}"[:300]
        return f"{self.kind}: {type(self.error).__name__}: {self.error}"[:400]


def attempt(call, *args, **kwargs):
    """Run ``call``; a :class:`CheckpointError` is a refusal, anything else a crash."""
    try:
        return Outcome("ok", call(*args, **kwargs))
    except CheckpointError as exc:
        return Outcome("refused", error=exc)
    except Exception as exc:
        return Outcome("crash", error=exc)


def restored_problems(outcome, allowed_steps, backend="hdf5"):
    """How a restore breaks "the step's own payload, of a committed step, or refuse"."""
    if outcome.kind == "crash":
        return [f"crashed: {outcome}"]
    if outcome.kind == "refused":
        return []
    got = outcome.value
    if got.step not in allowed_steps:
        return [
            f"restored step {got.step} ({got.path}), expected one of {allowed_steps}"
        ]
    bad = payload_mismatches(got.state, got.step, backend)
    return [f"step {got.step} read back wrong: {bad}"] if bad else []


@dataclass
class Cli:
    """One ``dp-ckpt`` run."""

    argv: list
    rc: int | None
    out: str
    err: str
    crash: str | None = None
    json: dict | None = field(default=None, repr=False)

    def __str__(self):
        head = f"dp-ckpt {' '.join(self.argv)}"
        if self.crash:
            return head
        return f"{head} (exit {self.rc}, stderr {self.err.strip()[:200]!r})"


def cli(*argv):
    """Run ``dp-ckpt argv`` in this process, capturing its output."""
    argv = [os.fspath(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    rc, crash = None, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's --help; never expected here
            rc = exc.code
        except Exception as exc:
            crash = f"{type(exc).__name__}: {str(exc)[:200]}"
    return Cli(argv, rc, out.getvalue(), err.getvalue(), crash)


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def strict_json(text):
    """Parse ``text`` as one strict JSON value (no NaN, Infinity)."""
    return json.loads(text, parse_constant=_refuse_constant)


def cli_problems(run):
    """How ``run`` breaks docs/command.md; sets ``run.json`` when it printed JSON.

    The rules: no uncaught exception, exit status 0, 1 or 2, no traceback, at
    most one line on stderr, a failure says why (on stderr, or for ``verify``
    in its report), and with ``--json`` the output is one strict JSON object.
    """
    if run.crash:
        return [f"uncaught {run.crash}"]
    problems = []
    if run.rc not in (0, 1, 2):
        problems.append(f"exit status {run.rc!r}")
    if "Traceback" in run.err:
        problems.append("a traceback on stderr")
    lines = [line for line in run.err.splitlines() if line.strip()]
    if len(lines) > 1:
        problems.append(f"{len(lines)} lines on stderr: {run.err[:300]!r}")
    if run.rc and not run.err.strip() and not run.out.strip():
        problems.append(f"exit status {run.rc} without a word")
    if "--json" in run.argv:
        if run.out.strip():
            try:
                run.json = strict_json(run.out)
            except ValueError as exc:
                problems.append(f"--json printed invalid JSON ({exc})")
            else:
                if not isinstance(run.json, dict):
                    problems.append("--json printed no object")
        elif run.rc == 0:
            problems.append("--json printed nothing")
    return problems


# -- looking at a directory -----------------------------------------------------


def tree_state(root):
    """Everything observable of a tree: path -> (kind, size, digest, mtime, link)."""
    root = Path(root)
    state = {}
    if not os.path.lexists(root):
        return state
    for base, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(base) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                state[rel] = ("file", st.st_size, digest, st.st_mtime_ns)
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir", st.st_mtime_ns)
            else:
                state[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_mtime_ns)
    return state


def tree_changes(before, after):
    """What differs between two :func:`tree_state` snapshots, for messages."""
    changes = []
    for rel in sorted(set(before) | set(after)):
        if rel not in after:
            changes.append(f"removed {rel}")
        elif rel not in before:
            changes.append(f"created {rel}")
        elif before[rel] != after[rel]:
            changes.append(f"changed {rel}")
    return changes


def flip_payload_byte(path, step, backend="hdf5"):
    """Flip one byte of the ``weights`` array's bytes in a checkpoint file.

    The size stays; the file still loads, with one wrong number, so only a
    digest can tell.
    """
    data = bytearray(Path(path).read_bytes())
    needle = make_arrays(step)["weights"].tobytes()
    at = data.find(needle)
    assert at >= 0, f"the weights of step {step} are not stored as they are in {path}"
    data[at + len(needle) // 2] ^= 0x5A
    Path(path).write_bytes(bytes(data))


def truncate(path, by=64):
    """Cut the last ``by`` bytes of a file."""
    size = Path(path).stat().st_size
    os.truncate(path, size - by)


# -- probes in processes of their own ---------------------------------------------

#: Seconds a probe may take before it counts as hung (an answer takes milliseconds).
PROBE_TIMEOUT = 5.0
#: Bytes of address space a probe process may add to what it held when forked.
PROBE_MEMORY = 64 << 20
#: Probe processes that may be busy at once: the machine's cores. A probe
#: running longer than :data:`PROBE_SLOW` seconds is most likely blocked (a
#: FIFO without a writer): the rest of its chain goes on in a new process,
#: and it keeps its deadline.
PROBE_PARALLEL = max(2, os.cpu_count() or 2)
PROBE_SLOW = 0.25
#: Probe processes alive at once, blocked ones included.
PROBE_ALIVE = 200


def run_probes(probes, root, *, timeout=PROBE_TIMEOUT):
    """Run probes in processes of their own; return ``{id: result}``.

    A probe is a dict: ``id`` (a file name, unique), ``module`` and
    ``function`` (called as ``function(directory, **args)`` with a fresh
    directory ``root/<id>``), ``args`` (JSON) and ``chain`` (probes of one
    chain run one after the other in one process, as long as each answers
    quickly). Its result is the dict the function returns, or
    ``{"status": "hung"}`` when it did not answer within ``timeout`` seconds
    (its process is killed), or ``{"status": "crash"}`` when it raised or
    its process died. Processes run with their address space capped
    (:data:`PROBE_MEMORY` beyond their start), so reading ``/dev/zero`` to
    the end fails with ``MemoryError`` instead of taking the machine's memory.
    """
    request = json.dumps({"root": str(root), "timeout": timeout, "probes": probes})
    package_root = str(Path(dp_ckpt_plugin.__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p
    )
    proc = subprocess.Popen(
        [sys.executable, __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent,
        env=env,
        start_new_session=True,
        text=True,
    )
    budget = 120 + timeout * (1 + len(probes) / PROBE_ALIVE) + len(probes)
    try:
        out, err = proc.communicate(request, timeout=budget)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # and any probe left behind
    if proc.returncode != 0:
        raise RuntimeError(
            f"the probe runner failed ({proc.returncode}): {err[-2000:]}"
        )
    return json.loads(out)


def _run_one(probe, root):
    function = getattr(importlib.import_module(probe["module"]), probe["function"])
    directory = Path(root) / probe["id"]
    directory.mkdir()
    try:
        return function(directory, **probe.get("args", {}))
    except BaseException as exc:
        return {"status": "crash", "detail": f"{type(exc).__name__}: {exc}"[:2000]}


def _chain_child(chain, root, out, control):
    """In a forked child: run ``chain`` while the runner says go on."""
    import resource

    pages = int(Path("/proc/self/statm").read_text().split()[0])
    cap = pages * os.sysconf("SC_PAGE_SIZE") + PROBE_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    for index, probe in enumerate(chain):
        os.write(out, f"S {index}\n".encode())
        result = _run_one(probe, root)
        os.write(out, f"R {index} {json.dumps(result, default=str)}\n".encode())
        if index == len(chain) - 1 or os.read(control, 1) != b"g":
            return


@dataclass
class _Running:
    pid: int
    out: int
    control: int
    chain: list
    current: int | None = None
    since: float = 0.0
    handed_off: bool = False
    buffer: bytes = b""


def _probe_runner():
    """The script: read a request on stdin, run its chains, print the results."""
    request = json.load(sys.stdin)
    root, timeout = request["root"], request["timeout"]
    logging.getLogger().addHandler(logging.NullHandler())  # no lastResort on stderr
    for module in sorted({p["module"] for p in request["probes"]}):
        importlib.import_module(module)
    store = template()  # made once, before forking; then warm every reader
    manager(store, lock=False).restore("latest")
    for argv in (
        ("ls", store),
        ("show", store),
        ("verify", store, "--digest"),
        ("inspect", store / ckpt_name(STEPS[-1])),
        ("prune", store, "--dry-run"),
        ("adopt", store, "--dry-run"),
    ):
        cli(*argv)
        cli(*argv, "--json")
    gc.collect()
    gc.freeze()  # the children's collections leave the inherited objects alone
    chains = {}
    for probe in request["probes"]:
        chains.setdefault(probe.get("chain", probe["id"]), []).append(probe)
    waiting = list(chains.values())
    running: dict[int, _Running] = {}
    results = {}

    def busy():
        now = time.monotonic()
        return sum(
            not r.handed_off and (r.current is None or now - r.since < PROBE_SLOW)
            for r in running.values()
        )

    def hand_off(r):
        if not r.handed_off and r.current is not None and r.current + 1 < len(r.chain):
            waiting.append(r.chain[r.current + 1 :])
        r.handed_off = True

    def finish(r):
        del running[r.out]
        os.close(r.out)
        os.close(r.control)
        os.waitpid(r.pid, 0)

    while waiting or running:
        while waiting and busy() < PROBE_PARALLEL and len(running) < PROBE_ALIVE:
            chain = waiting.pop(0)
            out_r, out_w = os.pipe()
            ctl_r, ctl_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(out_r)
                    os.close(ctl_w)
                    _chain_child(chain, root, out_w, ctl_r)
                finally:
                    os._exit(0)
            os.close(out_w)
            os.close(ctl_r)
            running[out_r] = _Running(pid, out_r, ctl_w, chain)
        ready, _, _ = select.select(list(running), [], [], 0.02)
        for fd in ready:
            r = running[fd]
            data = os.read(fd, 1 << 16)
            if not data:  # the process ended
                if r.current is not None and r.chain[r.current]["id"] not in results:
                    results[r.chain[r.current]["id"]] = {
                        "status": "crash",
                        "detail": "the probe process died",
                    }
                    hand_off(r)
                finish(r)
                continue
            r.buffer += data
            while b"\n" in r.buffer:
                line, r.buffer = r.buffer.split(b"\n", 1)
                kind, index, *rest = line.decode().split(" ", 2)
                r.current, r.since = int(index), time.monotonic()
                if kind == "R":
                    results[r.chain[r.current]["id"]] = json.loads(rest[0])
                    if r.current + 1 < len(r.chain):
                        os.write(r.control, b"s" if r.handed_off else b"g")
                    r.current = None
        now = time.monotonic()
        for r in list(running.values()):
            if r.current is None:
                continue
            if now - r.since > timeout:
                os.kill(r.pid, signal.SIGKILL)
                results[r.chain[r.current]["id"]] = {
                    "status": "hung",
                    "detail": f"no answer within {timeout:g} s (killed)",
                }
                hand_off(r)
                finish(r)
            elif now - r.since > PROBE_SLOW:
                hand_off(r)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    import trust_cases  # the module the probes import, not this __main__ copy

    trust_cases._probe_runner()
