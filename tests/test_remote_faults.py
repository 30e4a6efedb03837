"""A failure at every remote call: nothing committed is lost, one line at most.

The scenario (open, four saves with retention, close) is run once to list its
remote calls; then once per call and per kind of failure, that call failing:
a 503 before the call is carried out, a timeout after it was (its answer
lost), and a refused condition (412). Each run must either go on or stop with
one line naming the store, and leave a store whose HEAD names only objects
that are there and agree with their records; every step committed in the
staging directory is in HEAD, was removed by retention, or is still committed
in the staging directory; and a new run finds ``latest``.
"""

from __future__ import annotations

import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import (
    committed_steps,
    gone_holder,
    make_payload,
    payload_mismatches,
    remote_store,
)

from dp_ckpt_plugin.errors import CheckpointError
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.fetch import record_of
from dp_ckpt_plugin.storage.objects import (
    KeyExistsError,
    StorageUnavailableError,
    VersionMismatchError,
)

STEPS = [1, 2, 3, 4]
KEEP = 2


def scenario(pm, staging, storage) -> tuple[list[int], BaseException | None]:
    """Open, save, close; return the steps whose save returned, and the error."""
    saved: list[int] = []
    # as a process that then ends: the next run may take a lease it left
    store = remote_store(
        pm, staging, storage, keep=KEEP, upload_wait=5, holder=gone_holder()
    )
    store.remote.first_pause = 0.01
    try:
        for step in STEPS:
            store.save(step, make_payload(step))
            saved.append(step)
            store.remote.flush(10)  # each uploaded: a backlog sends the newest only
    except CheckpointError as exc:
        error = exc
    else:
        error = None
    try:
        store.close()
    except CheckpointError as exc:
        error = error or exc
    return saved, error


def calls(pm, tmp_path) -> list[tuple[str, str]]:
    storage = MemoryStorage(f"memory://calls{secrets.token_hex(3)}/run")
    seen: list[tuple[str, str]] = []
    storage.before("*", lambda key: None)
    original = storage._call

    def record(op, key):
        seen.append((op, key))
        original(op, key)

    storage._call = record
    scenario(pm, tmp_path / "count", storage)
    forget(storage.bucket_name)
    return seen


def _at(storage, key):
    return f"{storage.url}/{key}" if key else storage.url  # a key or a listed prefix


def _kinds(op):
    """(name, error(storage, key), after) of each failure a call of ``op`` can meet."""
    yield (
        "503",
        lambda s, k: StorageUnavailableError(_at(s, k), op, "503 Slow Down"),
        False,
    )
    if op in ("put", "put_if_absent", "put_if_match", "delete"):
        yield (
            "timeout",
            lambda s, k: StorageUnavailableError(_at(s, k), op, "timed out"),
            True,
        )
    if op == "put_if_match":
        yield "412", lambda s, k: VersionMismatchError(_at(s, k)), False
    if op == "put_if_absent":
        yield "412", lambda s, k: KeyExistsError(_at(s, k)), False


def test_a_failure_at_every_remote_call(pm, tmp_path):
    listed = calls(pm, tmp_path)
    assert len(listed) > 15, listed
    cases = 0
    for index, (op, _) in enumerate(listed):
        for kind, error, after in _kinds(op):
            cases += 1
            check_case(pm, tmp_path / f"c{index}-{kind}", index, op, error, after)
    print(f"\nremote faults: {len(listed)} calls, {cases} cases")


def check_case(pm, root, index, op, error, after):
    bucket = f"f{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    counter = {"n": 0}
    original = storage._call

    def count(o, key):
        position = counter["n"]
        counter["n"] += 1
        if position == index and o == op:
            storage.fail(o, lambda k: error(storage, k), key=key, after=after)
        original(o, key)

    storage._call = count
    saved, failure = scenario(pm, root / "s", storage)
    storage._call = original
    storage.clear_hooks()
    where = f"call {index} ({op}, {'after' if after else 'before'}): {failure}"
    if failure is not None:
        text = str(failure)
        assert "\n" not in text and "memory://" in text, where
    head, _ = heads.read(storage)
    staged = set(committed_steps(root / "s"))
    kept = []
    if head is not None:
        state = head.family("model.ckpt")
        for entry in state.kept:
            assert storage.head(entry.key) is not None, where
            record_of(storage, entry)  # agrees with HEAD, or raises
        kept = [e.step for e in state.kept]
    newest = max(kept, default=0)
    for step in saved:
        pruned = step < newest and len([s for s in kept if s > step]) >= KEEP - 1
        assert step in kept or step in staged or pruned, (where, step, kept, staged)
    if kept:
        with remote_store(pm, root / "next", storage) as store:
            found = store.resolve("latest")
            assert found.step == newest, where
            assert payload_mismatches(store.load(found), newest) == [], where
    forget(bucket)


@pytest.mark.parametrize("op", ["get", "put_if_absent", "put_if_match"])
def test_a_storage_that_stays_away_stops_the_start_with_one_line(pm, tmp_path, op):
    storage = MemoryStorage(f"memory://away{secrets.token_hex(3)}/run")
    storage.fail(op, times=100)
    store = remote_store(pm, tmp_path / "s", storage)
    with pytest.raises(CheckpointError) as caught:
        store.save(1, make_payload(1))
    assert "\n" not in str(caught.value) and "memory://" in str(caught.value)
    store.close()
    storage.clear_hooks()
    with remote_store(pm, tmp_path / "s2", storage) as again:  # and the next run starts
        again.save(1, make_payload(1))
        again.remote.flush(10)
    forget(storage.bucket_name)
