"""Class 3, what a name can be (rule 30): every reader answers in bounded time.

Where a store expects a file (the newest checkpoint's commit record, the
pointer, the alias, the manifest, the lock's holder note, the lock file, the
newest checkpoint itself), a case plants something else: a FIFO, a
directory, a UNIX socket, a symlink to ``/dev/zero``, a symlink to a FIFO
(7 places x 5 kinds), plus pointers naming ``/dev/zero`` and a FIFO: 37
cases. Each runs 11 operations: ``restore("latest")`` (verify="digest"),
``resolve("latest")``, a new run's ``save`` (it archives the earlier run),
``restore`` then ``save`` (the run goes on), each save followed by a
restore, and ``dp-ckpt ls``, ``show``, ``resolve``, ``inspect`` (of the
newest checkpoint), ``verify --digest``, ``prune`` and ``adopt``, each with
``--json``: 37 x 11 = 407 generated cases.

Each operation runs in a process of its own (``trust_cases.run_probes``),
killed after ``PROBE_TIMEOUT`` seconds and with its memory capped, so a
hang fails its case instead of the suite, and reading ``/dev/zero`` to the
end fails with ``MemoryError`` instead of taking the machine. A case passes
when the operation answered in time, raised nothing but a
``CheckpointError`` (the API) or ended as ``dp-ckpt`` must (exit status
0/1/2, one line on stderr, strict JSON), and a restore read back a
committed step's own payload.
"""

from __future__ import annotations

import os
import socket

import pytest
from helpers import make_payload
from trust_cases import (
    HOLDER,
    LOCK,
    MANIFEST,
    POINTER,
    PROBE_TIMEOUT,
    alias_name,
    attempt,
    ckpt_name,
    cli,
    cli_problems,
    clone,
    manager,
    record_of,
    restored_problems,
    run_probes,
    step_of,
)

PLACES = {
    "record": record_of(".", 3).name,
    "pointer": POINTER,
    "alias": alias_name(),
    "manifest": MANIFEST,
    "holder": HOLDER,
    "lock": LOCK,
    "checkpoint": ckpt_name(3),
}
KINDS = ("fifo", "directory", "socket", "link-to-dev-zero", "link-to-fifo")
CASES = [(place, kind) for place in PLACES for kind in KINDS] + [
    ("pointer", "names-dev-zero"),
    ("pointer", "names-fifo"),
]


def plant(store, place, kind):
    """Put a ``kind`` where ``store`` expects the file of ``place``."""
    name = store / PLACES[place]
    if os.path.lexists(name):
        name.unlink()
    if kind == "fifo":
        os.mkfifo(name)
    elif kind == "directory":
        name.mkdir()
    elif kind == "socket":
        here = os.getcwd()
        os.chdir(store)  # a socket's path is limited to 108 bytes
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(name.name)
        finally:
            os.chdir(here)
    elif kind == "link-to-dev-zero":
        os.symlink("/dev/zero", name)
    elif kind == "link-to-fifo":
        os.mkfifo(store / "planted.fifo")
        os.symlink("planted.fifo", name)
    elif kind == "names-dev-zero":
        name.write_text("/dev/zero\n")
    elif kind == "names-fifo":
        os.mkfifo(store / ckpt_name(4))
        name.write_text(ckpt_name(4) + "\n")
    else:
        raise ValueError(kind)


def _restore(store, verify):
    m = manager(store, verify=verify, max_keep=0)
    try:
        got = attempt(m.restore, "latest")
    finally:
        closed = attempt(m.close)
    problems = restored_problems(got, (1, 2, 3))
    return problems + ([f"close() {closed}"] if closed.kind == "crash" else [])


def _resolve(store):
    m = manager(store, max_keep=0)
    try:
        got = attempt(m.resolve, "latest")
    finally:
        attempt(m.close)
    if got.kind == "crash":
        return [f"resolve('latest') {got}"]
    if got.kind == "ok" and step_of(got.value.name) not in (1, 2, 3):
        return [f"resolve('latest') gave {got.value}"]
    return []


def _save(store, *, resume=False):
    m = manager(store, max_keep=0)
    problems = []
    try:
        if resume:  # the run goes on from latest: nothing is archived
            got = attempt(m.restore, "latest")
            problems += [
                f"restore('latest') {p}" for p in restored_problems(got, (1, 2, 3))
            ]
        saved = attempt(m.save, 10, make_payload(10))
        if saved.kind == "crash":
            problems.append(f"save(10) {saved}")
        elif saved.kind == "ok":
            back = attempt(m.restore, "latest")
            problems += [
                f"restore after save(10) {p}" for p in restored_problems(back, (10,))
            ]
    finally:
        closed = attempt(m.close)
        if closed.kind == "crash":
            problems.append(f"close() {closed}")
    return problems


def _command(*args):
    def run(store):
        argv = [store if a is None else a for a in args]
        argv = [store / ckpt_name(3) if a == "NEWEST" else a for a in argv]
        result = cli(*argv, "--json")
        return [f"{result}: {p}" for p in cli_problems(result)]

    return run


OPS = {
    "restore": lambda store: _restore(store, "digest"),
    "resolve": _resolve,
    "save": _save,
    "resume-save": lambda store: _save(store, resume=True),
    "cmd-ls": _command("ls", None),
    "cmd-show": _command("show", None),
    "cmd-resolve": _command("resolve", "latest", "--dir", None),
    "cmd-inspect": _command("inspect", "NEWEST"),
    "cmd-verify": _command("verify", None, "--digest"),
    "cmd-prune": _command("prune", None),
    "cmd-adopt": _command("adopt", None),
}


def probe(directory, place, kind, op):
    """Run in a process of its own: plant, then run one operation."""
    store = clone(directory / "s")
    plant(store, place, kind)
    problems = OPS[op](store)
    if not problems:
        return {"status": "ok"}
    crashed = any("crash" in p or "uncaught" in p for p in problems)
    return {"status": "crash" if crashed else "wrong", "detail": "; ".join(problems)}


def probe_id(place, kind, op):
    return f"{place}-{kind}-{op}"


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    """Run the probes of the selected cases of this module, all at once."""
    wanted = [
        item.callspec.params
        for item in request.session.items
        if item.module.__name__ == __name__ and hasattr(item, "callspec")
    ]
    probes = [
        {
            "id": probe_id(p["place"], p["kind"], p["op"]),
            "module": __name__,
            "function": "probe",
            "args": {"place": p["place"], "kind": p["kind"], "op": p["op"]},
            "chain": f"{p['place']}-{p['kind']}",
        }
        for p in wanted
    ]
    return run_probes(probes, tmp_path_factory.mktemp("names"))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize(("place", "kind"), CASES)
def test_answers_in_bounded_time(outcomes, place, kind, op):
    """A FIFO, directory, socket or device where a file is expected: no hang, no crash."""
    got = outcomes[probe_id(place, kind, op)]
    assert got["status"] == "ok", (
        f"{op} with a {kind} as the {place} ({PLACES[place]}): {got['status']}: "
        f"{got.get('detail', '')} (deadline {PROBE_TIMEOUT:g} s)"
    )
