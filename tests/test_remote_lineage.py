"""Lineage (rules 47, 48): a node's dead branch never reaches HEAD.

Node A trains and uploads, is cut off before some of its steps reach the
store, and node B resumes from HEAD under a newer epoch and trains on. A's
staging directory then holds a branch nobody continues. Whatever A does next
(restarts and trains, only reads ``latest``, runs ``dp-ckpt sync``), in any
order, HEAD's latest stays on B's branch, A's dead checkpoints survive in an
archive of A's staging directory, and one line names both branches, once.
The sequences are generated from seeds, on the in-process storage.
"""

from __future__ import annotations

import logging
import random

import pytest
from helpers import make_payload, remote_store

from dp_ckpt_plugin.checkpoint.lineage import Lineage, Link, chain_of, on_chain
from dp_ckpt_plugin.checkpoint.records import read_record
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import CheckpointWriteError
from dp_ckpt_plugin.remote import head as heads

PREFIX = "model.ckpt"
B_SALT = 100_000  # B's payloads differ from A's at the same step
DEAD = "a dead branch"


def _state(storage):
    head, _ = heads.read(storage)
    return head.family(PREFIX)


def _train(store, steps, salt=0):
    for step in steps:
        store.save(step, make_payload(step + salt))
        store.remote.flush(30)


def _cut_off(pm, staging, storage, uploaded, stranded):
    """A trains ``uploaded``, then commits ``stranded`` that never reach the store."""
    store = remote_store(pm, staging, storage, keep=0, upload_wait=0.3)
    _train(store, uploaded)
    storage.fail("put", times=10_000)
    for step in stranded:
        store.save(step, make_payload(step))
    with pytest.raises(CheckpointWriteError, match="could not be uploaded"):
        store.close()
    storage.clear_hooks()


def _b_goes_on(pm, staging, storage, steps):
    with remote_store(pm, staging, storage, keep=0) as store:
        found = store.resolve("latest")
        _train(store, steps, salt=B_SALT)
        return found.step


def _dead_lines(caplog, capsys):
    logged = [r.getMessage() for r in caplog.records if DEAD in r.getMessage()]
    printed = [line for line in capsys.readouterr().err.splitlines() if DEAD in line]
    return logged + printed


def _archived(staging):
    return sorted(
        int(p.name.rsplit("-", 1)[1].split(".")[0])
        for p in staging.glob("archive*/**/model.ckpt-*.h5")
    )


def _check_head_on_b(storage, b_newest):
    state = _state(storage)
    published = state.published
    assert published.step >= b_newest
    assert published.digest == state.lineage[-1].digest
    assert state.lineage[-1].epoch >= 2  # B's run or a later one, never A's first


@pytest.mark.parametrize("seed", range(8))
def test_a_dead_branch_never_reaches_head(pm, tmp_path, mem, caplog, capsys, seed):
    rng = random.Random(seed)
    uploaded = list(range(1, rng.randint(1, 3) + 1))
    last = uploaded[-1]
    stranded = list(range(last + 1, last + rng.randint(2, 4) + 1))
    b_steps = list(range(last + 1, last + rng.randint(1, len(stranded)) + 1))
    actions = [rng.choice(["restart", "latest", "sync"]) for _ in range(3)]
    a, b = tmp_path / "a", tmp_path / "b"
    caplog.set_level(logging.INFO, "dp_ckpt_plugin")

    _cut_off(pm, a, mem, uploaded, stranded)
    assert _b_goes_on(pm, b, mem, b_steps) == last
    b_newest = b_steps[-1]
    _check_head_on_b(mem, b_newest)
    b_digest = _state(mem).published.digest

    trained = b_newest
    for action in actions:
        if action == "restart":  # A starts again from latest and trains on
            with remote_store(pm, a, mem, keep=0) as store:
                found = store.resolve("latest")
                assert found.step == trained
                assert found.record.digest == _state(mem).published.digest
                trained += 1
                _train(store, [trained], salt=7 * B_SALT)
        elif action == "latest":  # A only reads latest
            with remote_store(pm, a, mem, keep=0) as store:
                assert store.resolve("latest").step == trained
        else:
            main(["sync", str(a), mem.url])
        _check_head_on_b(mem, b_newest)
        assert _state(mem).published.step == trained
    if trained == b_newest:
        assert _state(mem).published.digest == b_digest
    # A's dead checkpoints: archived in A's staging, never in HEAD
    assert _archived(a) == stranded
    kept = {(e.step, e.digest) for e in _state(mem).kept}
    for step in stranded:
        assert (
            step,
            read_record(next(a.glob(f"archive*/**/model.ckpt-{step}.h5"))).digest,
        ) not in kept
    said = _dead_lines(caplog, capsys)
    assert len(said) == 1, said
    assert f"step {stranded[-1]} (epoch 1)" in said[0]
    assert f"step {b_newest} (epoch 2)" in said[0]


def test_a_node_cut_off_that_nobody_replaced_still_uploads(pm, tmp_path, mem):
    """A's stranded steps continue HEAD's latest: its next start sends them."""
    _cut_off(pm, tmp_path / "a", mem, [1, 2], [3, 4])
    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        store.open()
        store.remote.flush(30)
        assert store.resolve("latest").step == 4
    state = _state(mem)
    assert state.published.step == 4
    assert state.lineage == (Link(1, 4, state.published.digest),)


def test_records_carry_their_parent_and_head_its_lineage(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        _train(store, [1, 2])
    with remote_store(pm, tmp_path / "b", mem, keep=0) as store:
        store.resolve("latest")
        _train(store, [3])
    one = read_record(tmp_path / "a" / "model.ckpt-1.h5")
    two = read_record(tmp_path / "a" / "model.ckpt-2.h5")
    three = read_record(tmp_path / "b" / "model.ckpt-3.h5")
    assert one.lineage == Lineage(1, ())
    assert two.lineage == Lineage(1, (Link(1, 1, one.digest),))
    assert three.lineage.parent == Link(1, 2, two.digest)
    assert three.lineage.epoch == 2
    assert _state(mem).lineage == (Link(1, 2, two.digest), Link(2, 3, three.digest))


def test_on_chain_decides_from_the_segments():
    a20, a40 = Link(1, 20, "d:20"), Link(1, 40, "d:40")
    b50 = Link(2, 50, "d:50")
    head = chain_of(Lineage(2, (a20,)), 50, "d:50")
    assert head == (a20, b50)
    assert on_chain(head, Link(1, 10, "d:10"))  # an older step of A's run
    assert not on_chain(head, a40)  # A went on past where B resumed
    assert not on_chain((a40,), b50)
    assert on_chain((a40,), a20)
    assert not on_chain((Link(0, 5, "x"),), Link(0, 4, "y"))  # no run: exact only


def test_a_record_without_lineage_is_read(tmp_path):
    import json

    from dp_ckpt_plugin.checkpoint.records import CommitRecord

    text = json.dumps(
        {
            "name": "m-5.pt",
            "step": 5,
            "family": "m",
            "format": "torch",
            "size": 1,
            "digest": "blake3:" + "ab" * 32,
            "format_version": 2,
        }
    )
    assert CommitRecord.from_json(text, source=tmp_path).lineage is None


def test_on_s3_a_fenced_nodes_branch_stays_local(pm, tmp_path, s3_bucket, caplog):
    """Moto's S3: A is paused, B takes over and trains on; A's fenced step stays
    in A's staging (archived), its end does not advise a sync, and neither its
    restart nor ``dp-ckpt sync`` moves HEAD onto it."""
    import time

    from dp_ckpt_plugin.objectstore.registry import storage_for

    caplog.set_level(logging.INFO, "dp_ckpt_plugin")
    a = tmp_path / "a"
    zombie = remote_store(pm, a, storage_for(s3_bucket.url), keep=0, ttl=5)
    _train(zombie, [1])
    zombie.remote.lease._stop.set()  # paused: it renews no more
    newer = remote_store(pm, tmp_path / "b", storage_for(s3_bucket.url), keep=0, ttl=5)
    newer.remote.lease._wall = lambda: time.time() + 60
    assert newer.resolve("latest").step == 1
    zombie.save(2, make_payload(2))  # committed in A's staging, fenced at its swap
    with pytest.raises(CheckpointWriteError, match="another run took the store over"):
        zombie.remote.flush(60)
    _train(newer, [2, 3, 4], salt=B_SALT)
    newer.close()
    try:
        zombie.close()
    except CheckpointWriteError as exc:
        assert "dp-ckpt sync" not in str(exc)
    storage = storage_for(s3_bucket.url)
    with remote_store(pm, a, storage, keep=0) as store:
        assert store.resolve("latest").step == 4
    assert main(["sync", str(a), s3_bucket.url]) == 0
    state = _state(storage)
    assert state.published.step == 4 and state.lineage[-1].epoch == 2
    assert _archived(a) == [2]
    said = [r.getMessage() for r in caplog.records if DEAD in r.getMessage()]
    assert len(said) == 1 and "step 2 (epoch 1)" in said[0]
    assert "step 4 (epoch 2)" in said[0]


def test_a_fenced_writers_end_does_not_advise_a_sync(pm, tmp_path, mem):
    """Its last upload meets the takeover while a newer save waits: what is left
    is named, with no `dp-ckpt sync` to send it."""
    import threading
    import time

    zombie = remote_store(pm, tmp_path / "z", mem, keep=0, ttl=0.6)
    _train(zombie, [1])
    lease = zombie.remote.lease
    lease._stop.set()  # paused: it renews no more
    lease._thread.join()
    lease._thread = None
    sending, go = threading.Event(), threading.Event()

    def hold(key):
        if key.endswith("model.ckpt-2.h5"):
            sending.set()
            go.wait(30)

    mem.before("put", hold)
    zombie.save(2, make_payload(2))
    assert sending.wait(30)
    zombie.save(3, make_payload(3))  # queued behind step 2
    newer = remote_store(pm, tmp_path / "n", mem, keep=0, ttl=0.6)
    newer.remote.lease._wall = lambda: time.time() + 60
    assert newer.resolve("latest").step == 1
    go.set()
    with pytest.raises(CheckpointWriteError) as ended:
        zombie.close()
    said = str(ended.value)
    assert "dp-ckpt sync" not in said and "taken over by a newer run" in said
    assert "model.ckpt-3.h5" in said
    mem.clear_hooks()
    newer.close()
    assert _state(mem).published.step == 1


def _run_node(pm, staging, storage, event, k, salt):
    """One event of a node: train ``k`` steps, be cut off after ``k`` more,
    only read latest, or sync its staging directory."""
    if event == "sync":
        main(["sync", str(staging), storage.url])
        return
    store = remote_store(pm, staging, storage, keep=0, upload_wait=0.3)
    try:
        head, _ = heads.read(storage)
        start = 0
        if head is not None and not head.empty:
            start = store.resolve("latest").step
        if event == "train":
            _train(store, range(start + 1, start + k + 1), salt=salt)
        elif event == "cut":
            storage.fail("put", times=10_000)
            for step in range(start + 1, start + k + 1):
                store.save(step, make_payload(step + salt))
    finally:
        try:
            store.close()
        except CheckpointWriteError:
            assert event == "cut"
        storage.clear_hooks()


@pytest.mark.parametrize("seed", range(10))
def test_cuts_restarts_and_syncs_on_two_nodes_never_fork_latest(
    pm, tmp_path, mem, seed
):
    """A random walk of trains, cuts, reads of latest and syncs on two nodes:
    each new latest of HEAD continues the one before (never another branch),
    and no committed checkpoint is lost (each is in HEAD or in its staging)."""
    from dp_ckpt_plugin.checkpoint.lineage import on_chain

    rng = random.Random(1000 + seed)
    nodes = {"a": tmp_path / "a", "b": tmp_path / "b"}
    salts = {"a": 0, "b": B_SALT}
    tip, seen = None, set()
    for turn in range(8):
        node = rng.choice(sorted(nodes))
        event = rng.choice(["train", "cut", "cut", "latest", "sync"])
        if turn == 0 or (not nodes[node].exists() and event == "sync"):
            event = "train"
        _run_node(pm, nodes[node], mem, event, rng.randint(1, 3), salts[node] + turn)
        seen |= {read_record(p).digest for s in nodes.values() for p in _staged(s)}
        state = _state(mem)
        if state.published is None:
            continue
        now = state.lineage[-1]
        assert (now.step, now.digest) == (state.published.step, state.published.digest)
        if tip is not None:
            assert on_chain(state.lineage, tip), (turn, node, event, tip, now)
        tip = now
    staged = [p for s in nodes.values() for p in _staged(s)]
    assert all(read_record(p).lineage is not None for p in staged)
    held = {e.digest for e in _state(mem).kept} | {
        read_record(p).digest for p in staged
    }
    assert seen <= held  # nothing committed was lost: in HEAD, staged or archived


def _staged(staging):
    return [p for p in staging.rglob("model.ckpt-*.h5") if "quarantine" not in str(p)]
