"""Every defect of the newest remote checkpoint falls back, with one warning (rule 20).

Generated over the kinds of defect a store can hold for its newest
checkpoint (payload missing, flipped, truncated, swapped; record missing,
oversized, garbage, disagreeing, naming another checkpoint or a key outside
the store's grammar): ``latest`` resolves to the previous committed
checkpoint, and says so in one warning that names both.
"""

from __future__ import annotations

import json
import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import make_payload, plugin_manager, remote_store

from dp_ckpt_plugin.checkpoint.records import MAX_RECORD_BYTES
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import RestartNotFoundError
from dp_ckpt_plugin.objectstore.registry import storage_for
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import record_key

PREFIX = "model.ckpt"


def _renamed(name):
    def change(storage, newest, older):
        key = record_key(newest.key)
        record = json.loads(storage.get(key)[0])
        record["name"] = name
        storage.put(key, json.dumps(record).encode())

    return change


def _record_bytes(data):
    return lambda s, newest, older: s.put(record_key(newest.key), data)


def _payload(change):
    def spoil(storage, newest, older):
        data = storage.get(newest.key, 1 << 30)[0]
        storage.put(newest.key, change(data, storage.get(older.key, 1 << 30)[0]))

    return spoil


#: Each defect, as what it does to the store (newest and older are HEAD entries).
DEFECTS = {
    "payload missing": lambda s, newest, older: s.delete(newest.key),
    "payload flipped": _payload(lambda d, o: d[:-1] + bytes([d[-1] ^ 1])),
    "payload truncated": _payload(lambda d, o: d[: len(d) // 2]),
    "payload empty": _payload(lambda d, o: b""),
    "payload swapped": _payload(lambda d, o: o),
    "record missing": lambda s, newest, older: s.delete(record_key(newest.key)),
    "record oversized": _record_bytes(b" " * (MAX_RECORD_BYTES + 1)),
    "record not utf-8": _record_bytes(b"\xff\xfe{"),
    "record not json": _record_bytes(b"{"),
    "record a list": _record_bytes(b"[]"),
    "record empty": _record_bytes(b""),
    "record of the older": lambda s, newest, older: s.put(
        record_key(newest.key), s.get(record_key(older.key))[0]
    ),
    "record naming HEAD": _renamed("HEAD"),
    "record naming a climbing key": _renamed("../model.ckpt-2.h5"),
    "record naming a key with a folder": _renamed("e000001/model.ckpt-2.h5"),
    "record naming a URL": _renamed("s3://bucket/run/e000001/model.ckpt-2.h5"),
    "record naming another checkpoint": _renamed("model.ckpt-3.h5"),
}


def _store_of_two(pm, tmp_path, storage):
    with remote_store(pm, tmp_path / "w", storage, keep=0) as store:
        for step in (1, 2):
            store.save(step, make_payload(step))
            store.remote.flush(60)
    head, _ = heads.read(storage)
    state = head.family(PREFIX)
    return state.published, state.entry(state.kept[0].key)


def _falls_back(pm, tmp_path, storage, defect):
    newest, older = _store_of_two(pm, tmp_path, storage)
    DEFECTS[defect](storage, newest, older)
    with remote_store(pm, tmp_path / "r", storage) as store:
        found = store.resolve("latest")
    assert found.step == 1 and found.fell_back, defect
    (warning,) = found.warnings
    assert "\n" not in warning
    assert (
        storage.url_of(newest.key) in warning
        or storage.url_of(record_key(newest.key)) in warning
    ), warning
    assert storage.url_of(older.key) in warning, warning
    assert not (tmp_path / "r" / newest.name).exists()
    return warning


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_defect_of_the_newest_falls_back(pm, tmp_path, defect):
    bucket = f"f{secrets.token_hex(4)}"
    try:
        _falls_back(pm, tmp_path, MemoryStorage(f"memory://{bucket}/run"), defect)
    finally:
        forget(bucket)


@pytest.mark.parametrize("defect", ["payload missing", "record oversized"])
def test_on_s3_too(pm, tmp_path, s3_bucket, defect):
    warning = _falls_back(pm, tmp_path, storage_for(s3_bucket.url), defect)
    assert "write" not in warning  # never blamed on a local write


def test_the_command_says_the_fallback_in_one_line(pm, tmp_path, capsys):
    bucket = f"f{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        newest, _ = _store_of_two(pm, tmp_path, storage)
        storage.delete(newest.key)
        assert main(["resolve", storage.url, "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["step"] == 1
        assert len([line for line in err.splitlines() if line.strip()]) <= 1
    finally:
        forget(bucket)


def test_when_every_checkpoint_is_broken_it_is_one_line(pm, tmp_path):
    bucket = f"f{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        newest, older = _store_of_two(pm, tmp_path, storage)
        storage.delete(newest.key)
        storage.delete(record_key(older.key))
        with (
            pytest.raises(RestartNotFoundError) as refused,
            remote_store(plugin_manager(), tmp_path / "r", storage) as store,
        ):
            store.resolve("latest")
        assert "\n" not in str(refused.value) and storage.url in str(refused.value)
    finally:
        forget(bucket)
