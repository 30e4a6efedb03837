"""A forked child of a process that used the plugin (rule 43).

Generated: for each start method (fork, forkserver), after each kind of
prior activity in this process (nothing, a synchronous save, a background
save held in flight, a verified restore, a store on S3 open), every public
operation runs in a child under a timeout: a save, a background save and one
by a writer process, of a payload large enough to be hashed on BLAKE3's
threads, a restore verified
by digest, a store on S3 saved to and restored from, and (fork only: the
child has the parent's objects) every method of the parent's own manager,
which is refused in one line. A child that does not answer in time hung.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import subprocess
import sys
import threading
import traceback

import numpy as np
import pytest
from helpers import plugin_manager

from dp_ckpt_plugin import CheckpointManager, hookimpl
from dp_ckpt_plugin.errors import ForkedError
from dp_ckpt_plugin.objectstore import cloud

#: Large enough to be hashed on BLAKE3's thread pool (4 MiB and more).
SIZE = 6 << 20
TIMEOUT = 60


def payload(step: int) -> dict:
    return {"w": np.full(SIZE // 8, float(step)), "step": np.int64(step)}


def _same(state: dict, step: int) -> bool:
    return state["w"].tobytes() == payload(step)["w"].tobytes()


# -- what the child does ------------------------------------------------------------------
def op_save(where: dict) -> None:
    with CheckpointManager(where["new"], verify="digest", pm=plugin_manager()) as m:
        m.save(3, payload(3))
        assert _same(m.restore("latest").state, 3)


def op_background_save(where: dict) -> None:
    with CheckpointManager(
        where["new"], async_save=True, verify="digest", pm=plugin_manager()
    ) as m:
        m.save(4, payload(4))
        m.wait()
        assert _same(m.restore("latest").state, 4)


def op_writer_process(where: dict) -> None:
    with CheckpointManager(
        where["new"],
        async_save=True,
        writer="process",
        verify="digest",
        pm=plugin_manager(),
    ) as m:
        m.save(6, payload(6))
        m.wait()
        assert _same(m.restore("latest").state, 6)


def op_verified_restore(where: dict) -> None:
    with CheckpointManager(where["saved"], verify="digest", pm=plugin_manager()) as m:
        restored = m.restore("latest")
        assert restored.step == 1 and _same(restored.state, 1)


def op_remote(where: dict) -> None:
    """Works, or, in a child forked after its parent used object storage,
    is refused in one line (obstore's runtime does not survive a fork)."""
    os.environ.update(where["env"])
    url = f"{where['url']}-child-{secrets.token_hex(3)}"
    if where["refused"]:
        with pytest.raises(ForkedError, match="forkserver") as refused:
            CheckpointManager(url, staging=where["new"], pm=plugin_manager())
        assert "\n" not in str(refused.value)
        return
    with CheckpointManager(
        url, staging=where["new"], verify="digest", pm=plugin_manager()
    ) as m:
        m.save(5, payload(5))
        assert m.flush(30)
    with CheckpointManager(
        url, staging=where["new"] + "-b", verify="digest", pm=plugin_manager()
    ) as m:
        assert _same(m.restore("latest").state, 5)


#: The parent's manager, as a forked child sees it.
INHERITED: list = []


def op_inherited(where: dict) -> None:
    (manager,) = INHERITED
    calls = {
        "save": lambda: manager.save(9, payload(9)),
        "wait": manager.wait,
        "resolve": lambda: manager.resolve("latest"),
        "restore": lambda: manager.restore("latest"),
        "flush": lambda: manager.flush(1),
        "close": manager.close,
    }
    for name, call in calls.items():
        try:
            call()
        except ForkedError as exc:
            text = str(exc)
            assert "\n" not in text and "is a fork of it" in text, text
        else:
            if name != "flush" or manager.store.remote is not None:
                raise AssertionError(f"{name} was not refused in a forked child")


OPS = {
    "save": op_save,
    "background save": op_background_save,
    "background save by a writer process": op_writer_process,
    "verified restore": op_verified_restore,
    "remote save and restore": op_remote,
    "the parent's manager": op_inherited,
}


def _child(op: str, where: dict) -> None:
    try:
        OPS[op](where)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


# -- what the parent did before ------------------------------------------------------------
class Held:
    """An observer that holds a background save in flight until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    @hookimpl
    def on_commit(self, commit):
        self.entered.set()
        self.release.wait(TIMEOUT)


@contextlib.contextmanager
def prior(kind: str, tmp_path, where: dict):
    """Do ``kind`` in this process, and keep it going while children run."""
    if kind == "nothing":
        yield None
    elif kind == "sync save":
        with CheckpointManager(
            tmp_path / "p", verify="digest", pm=plugin_manager()
        ) as m:
            m.save(2, payload(2))
            yield m
    elif kind == "background save in flight":
        held = Held()
        m = CheckpointManager(
            tmp_path / "p", async_save=True, verify="digest", pm=plugin_manager(held)
        )
        try:
            m.save(2, payload(2))
            assert held.entered.wait(TIMEOUT)
            yield m  # the worker thread holds the store's locks now
        finally:
            held.release.set()
            m.close()
    elif kind == "verified restore":
        with CheckpointManager(
            where["saved"], verify="digest", pm=plugin_manager()
        ) as m:
            assert _same(m.restore("latest").state, 1)
            yield m
    elif kind == "remote store open":
        url = f"{where['url']}-parent"
        with CheckpointManager(
            url, staging=tmp_path / "ps", verify="digest", pm=plugin_manager()
        ) as m:
            m.save(2, payload(2))
            assert m.flush(30)
            yield m
    else:
        raise ValueError(kind)


PRIOR = [
    "nothing",
    "sync save",
    "background save in flight",
    "verified restore",
    "remote store open",
]


@pytest.mark.parametrize("kind", PRIOR)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_every_operation_in_a_child_after_each_kind_of_activity(
    tmp_path, s3_bucket, method, kind
):
    saved = tmp_path / "saved"
    with CheckpointManager(saved, pm=plugin_manager()) as m:
        m.save(1, payload(1))
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k == "HOME"}
    where = {"saved": str(saved), "url": s3_bucket.url, "env": env}
    context = multiprocessing.get_context(method)
    problems = []
    with prior(kind, tmp_path, where) as manager:
        for op in OPS:
            if op == "the parent's manager" and (method != "fork" or manager is None):
                continue
            INHERITED[:] = [manager] if manager is not None else []
            child_where = {
                **where,
                "new": str(tmp_path / f"c-{op.replace(' ', '-')}"),
                "refused": method == "fork" and cloud._RUNTIME["used"],
            }
            child = context.Process(target=_child, args=(op, child_where))
            child.start()
            child.join(TIMEOUT)
            if child.is_alive():
                child.kill()
                child.join()
                problems.append(f"{op}: hung (no answer in {TIMEOUT} s)")
            elif child.exitcode != 0:
                problems.append(f"{op}: exit status {child.exitcode}")
    INHERITED.clear()
    assert not problems, f"{method} after {kind}: " + "; ".join(problems)


def test_the_parent_goes_on_after_its_children(tmp_path):
    """A child's refusal leaves the parent's store as it was: its lock held,
    its saves going on."""
    with CheckpointManager(tmp_path / "p", verify="digest", pm=plugin_manager()) as m:
        m.save(1, payload(1))
        INHERITED[:] = [m]
        child = multiprocessing.get_context("fork").Process(
            target=_child, args=("the parent's manager", {})
        )
        child.start()
        child.join(TIMEOUT)
        INHERITED.clear()
        assert child.exitcode == 0
        m.save(2, payload(2))
        assert m.restore("latest").step == 2
        code = (
            "from dp_ckpt_plugin import CheckpointManager\n"
            f"CheckpointManager({str(tmp_path / 'p')!r}).save(3, {{'a': 1}})\n"
        )
        other = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert other.returncode != 0 and "is in use by another run" in other.stderr
