"""Everything a remote store holds is untrusted (rule 30): HEAD, LEASE, records.

Every field of a valid HEAD, LEASE and commit record is replaced in turn by
each hostile value; a reader and a writer must then either work or stop with
one :class:`~dp_ckpt_plugin.errors.CheckpointError` line naming the store,
never another exception, and a reader never hands over a payload that does
not match its record.
"""

from __future__ import annotations

import copy
import json
import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import gone_holder, make_payload, remote_store

from dp_ckpt_plugin.errors import CheckpointError
from dp_ckpt_plugin.remote.keys import HEAD_KEY, LEASE_KEY, record_key

HOSTILE = [
    None,
    True,
    -1,
    2**70,
    1.5,
    float("nan"),
    "",
    "x" * 5000,
    "../../etc/passwd",
    "/abs/key",
    "a//b",
    [],
    {},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    {"nested": {"deeper": [1, 2, {"x": None}]}},
]


def paths(value, prefix=()):
    """Every path to a field in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from paths(item, (*prefix, index))


def replaced(document, path, value):
    changed = copy.deepcopy(document)
    target = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A remote store with two committed steps: its objects, to be spoiled."""
    from helpers import plugin_manager

    pm = plugin_manager()
    bucket = f"t{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    root = tmp_path_factory.mktemp("trust")
    with remote_store(pm, root / "w", storage, keep=0, holder=gone_holder()) as store:
        for step in (1, 2):
            store.save(step, make_payload(step))
        store.remote.flush(10)
    objects = {i.key: storage.get(i.key, 1 << 30)[0] for i in storage.list("")}
    forget(bucket)
    return objects


def spoiled(written, key, text):
    bucket = f"s{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    for k, data in written.items():
        storage.put(k, text if k == key else data)
    return storage


def check_reader_and_writer(pm, tmp_path, storage, where):
    for name, act in (("reader", "resolve"), ("writer", "save")):
        store = remote_store(pm, tmp_path / f"{name}-{secrets.token_hex(3)}", storage)
        try:
            if act == "resolve":
                found = store.resolve("latest")
                assert found.path.exists(), where
            else:
                store.save(3, make_payload(3))
                store.remote.flush(10)
        except CheckpointError as exc:
            assert "\n" not in str(exc), (where, exc)
        finally:
            try:
                store.close()
            except CheckpointError as exc:
                assert "\n" not in str(exc), (where, exc)


def _cases(document):
    for path in paths(document):
        for value in HOSTILE:
            yield path, value


def test_every_field_of_head_with_every_hostile_value(pm, tmp_path, written):
    head = json.loads(written[HEAD_KEY])
    cases = list(_cases(head))
    for index, (path, value) in enumerate(cases):
        text = json.dumps(replaced(head, path, value), allow_nan=True).encode()
        storage = spoiled(written, HEAD_KEY, text)
        check_reader_and_writer(pm, tmp_path / f"h{index}", storage, (path, value))
        forget(storage.bucket_name)
    print(f"\nHEAD: {len(cases)} cases")


@pytest.mark.parametrize(
    "text",
    [b"", b"\0\1\2", b"\xff\xfe", b"[]", b"null", b"{" * 100000, b"1" * (17 << 20)],
    ids=["empty", "binary", "not-utf8", "list", "null", "deep", "huge"],
)
def test_head_that_is_not_json_at_all(pm, tmp_path, written, text):
    storage = spoiled(written, HEAD_KEY, text)
    check_reader_and_writer(pm, tmp_path, storage, text[:10])
    forget(storage.bucket_name)


def test_every_field_of_the_lease_with_every_hostile_value(pm, tmp_path, written):
    lease = json.loads(written[LEASE_KEY])
    cases = list(_cases(lease))
    for index, (path, value) in enumerate(cases):
        text = json.dumps(replaced(lease, path, value), allow_nan=True).encode()
        storage = spoiled(written, LEASE_KEY, text)
        check_reader_and_writer(pm, tmp_path / f"l{index}", storage, (path, value))
        forget(storage.bucket_name)
    print(f"\nLEASE: {len(cases)} cases")


def test_every_field_of_a_record_with_every_hostile_value(pm, tmp_path, written):
    head = json.loads(written[HEAD_KEY])
    newest = head["families"]["model.ckpt"]["latest"]
    key = record_key(newest)
    record = json.loads(written[key])
    cases = list(_cases(record))
    for index, (path, value) in enumerate(cases):
        text = json.dumps(replaced(record, path, value), allow_nan=True).encode()
        storage = spoiled(written, key, text)
        store = remote_store(pm, tmp_path / f"r{index}", storage)
        try:
            found = store.resolve("latest")
            # a record that no longer agrees makes the reader fall back to step 1
            assert found.step in (1, 2), (path, value)
            if found.step == 2:
                assert found.record.digest == record["digest"], (path, value)
        except CheckpointError as exc:
            assert "\n" not in str(exc), (path, value, exc)
        finally:
            store.close()
        forget(storage.bucket_name)
    print(f"\nrecord: {len(cases)} cases")
