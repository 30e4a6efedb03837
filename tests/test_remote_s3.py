"""The remote store against a real S3 endpoint (moto's server on loopback).

What needs atomic conditions under races runs on the in-process storage
(``test_remote_store.py``): moto checks a condition and then writes without
a lock. Here: the layout, restarts on another node, the calls a save makes,
a zombie fenced off, the server killed in the middle of an upload, and the
first contact failing in one line.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import gone_holder, remote_store

from dp_ckpt_plugin.errors import CheckpointError, CheckpointWriteError
from dp_ckpt_plugin.objectstore.registry import storage_for
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import HEAD_KEY, LEASE_KEY

PREFIX = "model.ckpt"


def payload(step, size=1 << 16):
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal(size // 8), "step": np.int64(step)}


def test_saves_upload_and_a_new_node_restarts_from_them(pm, tmp_path, s3_bucket):
    storage = storage_for(s3_bucket.url)
    with remote_store(pm, tmp_path / "a", storage, keep=2) as store:
        for step in (1, 2, 3):
            store.save(step, payload(step))
            store.remote.flush(60)  # each uploaded (a backlog sends only the newest)
        before = dict(storage.counts)
        store.save(4, payload(4))
        store.remote.flush(60)
        calls = {k: storage.counts[k] - before.get(k, 0) for k in storage.counts}
    assert {k: v for k, v in calls.items() if v and k != "requests"} == {
        "put": 1,
        "put_if_absent": 1,
        "put_if_match": 1,
        "delete": 2,
    }
    keys = s3_bucket.keys()
    head, _ = heads.read(storage)
    assert [e.step for e in head.family(PREFIX).kept] == [3, 4]
    assert set(keys) == {f"run/{k}" for k in {HEAD_KEY, LEASE_KEY} | head.referenced()}
    with remote_store(pm, tmp_path / "b", storage_for(s3_bucket.url)) as store:
        found = store.resolve("latest")
        assert found.step == 4 and found.path.parent == tmp_path / "b"
        back = store.load(found)
        assert back["w"].tobytes() == payload(4)["w"].tobytes()


def test_a_zombie_after_takeover_on_s3(pm, tmp_path, s3_bucket):
    zombie = remote_store(pm, tmp_path / "z", storage_for(s3_bucket.url), ttl=5)
    zombie.save(1, payload(1))
    zombie.remote.flush(60)
    zombie.remote.lease._stop.set()  # paused: it renews no more
    newer = remote_store(pm, tmp_path / "n", storage_for(s3_bucket.url), ttl=5)
    newer.remote.lease._wall = lambda: time.time() + 60
    assert newer.resolve("latest").step == 1
    zombie.save(2, payload(2))
    with pytest.raises(CheckpointWriteError, match="another run took the store over"):
        zombie.remote.flush(60)
    head, _ = heads.read(newer.remote.storage)
    assert head.epoch == 2 and [e.step for e in head.family(PREFIX).kept] == [1]
    newer.close()
    zombie.close()


def test_the_server_killed_mid_upload_and_restarted(pm, tmp_path, s3_bucket):
    storage = storage_for(s3_bucket.url)
    store = remote_store(pm, tmp_path / "s", storage, holder=gone_holder())
    store.remote.first_pause = 0.2
    big = payload(1, size=40 << 20)  # several parts
    uploading = threading.Event()
    original = storage.put

    def put(key, data):
        uploading.set()
        return original(key, data)

    storage.put = put
    store.save(1, big)
    assert uploading.wait(30)
    time.sleep(0.3)
    s3_bucket.server.stop()
    time.sleep(1.0)
    s3_bucket.server.start()
    store.remote.flush(120)
    head, _ = heads.read(storage)
    assert [e.step for e in head.family(PREFIX).kept] == [1]
    store.close()
    # the next writer aborts what the cut upload left, and the checkpoint reads back
    with remote_store(pm, tmp_path / "n", storage_for(s3_bucket.url)) as again:
        found = again.resolve("latest")
        again.remote.flush(60)
        assert again.load(found)["w"].tobytes() == big["w"].tobytes()
    assert s3_bucket.uploads() == []


@pytest.mark.parametrize("case", ["missing-bucket", "no-credentials", "bad-url"])
def test_the_first_contact_fails_in_one_line(
    pm, tmp_path, s3_bucket, monkeypatch, case
):
    url = s3_bucket.url
    if case == "missing-bucket":
        url = "s3://no-such-bucket-here/run"
    elif case == "no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    else:
        url = "s3://Bad_Bucket/run"
    from s3_server import SECRET_ACCESS_KEY

    started = time.monotonic()
    with pytest.raises(CheckpointError) as caught:
        store = remote_store(pm, tmp_path / "s", storage_for(url))
        try:
            store.open()
        finally:
            store.close()
    text = str(caught.value)
    assert "\n" not in text and SECRET_ACCESS_KEY not in text
    assert time.monotonic() - started < 30
