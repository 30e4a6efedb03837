"""``dp-ckpt`` on stores on object storage: ls, verify, resolve, inspect, prune, sync.

Run in the test's process (``commands.main``), on the in-process storage and
on moto's S3 server; ``--json`` output is parsed strictly.
"""

from __future__ import annotations

import json
import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import committed_steps, gone_holder, make_payload, remote_store

from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.objectstore.registry import storage_for
from dp_ckpt_plugin.remote import head as heads


def strict(text):
    def refuse(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(params=["memory", "s3"])
def store_url(request, pm, tmp_path):
    """The URL of a remote store holding steps 1-3 (keep 0), on either storage."""
    if request.param == "memory":
        bucket = f"c{secrets.token_hex(4)}"
        url = f"memory://{bucket}/run"
        cleanup = lambda: forget(bucket)  # noqa: E731
    else:
        s3_bucket = request.getfixturevalue("s3_bucket")
        url, cleanup = s3_bucket.url, (lambda: None)
    with remote_store(
        pm, tmp_path / "w", storage_for(url), keep=0, holder=gone_holder()
    ) as s:
        for step in (1, 2, 3):
            s.save(step, make_payload(step))
            s.remote.flush(60)  # each uploaded (a backlog sends only the newest)
    yield url
    cleanup()


def test_ls_lists_what_head_keeps(store_url, capsys):
    assert main(["ls", store_url, "--json"]) == 0
    data = strict(capsys.readouterr().out)
    (family,) = data["families"]
    assert [c["step"] for c in family["checkpoints"]] == [1, 2, 3]
    assert [c["published"] for c in family["checkpoints"]] == [False, False, True]
    assert data["lease"]["released"] is True
    assert main(["ls", store_url]) == 0
    assert "<- latest" in capsys.readouterr().out


def test_verify_hashes_every_payload_and_finds_a_bad_one(store_url, capsys):
    assert main(["verify", store_url]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 checkpoint(s)" in out and "hashed" in out
    storage = storage_for(store_url)
    head, _ = heads.read(storage)
    entry = head.family("model.ckpt").kept[0]
    data, _ = storage.get(entry.key, 1 << 30)
    storage.put(entry.key, bytes([data[0] ^ 1]) + data[1:])
    assert main(["verify", store_url, "--json"]) == 1
    found = strict(capsys.readouterr().out)
    assert found["sound"] == 2
    assert [r["step"] for r in found["checkpoints"] if r["problem"]] == [1]


def test_resolve_path_prints_the_url(store_url, capsys):
    assert main(["resolve", "latest", "--dir", store_url, "--path"]) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith(store_url + "/") and url.endswith("model.ckpt-3.h5")
    assert main(["resolve", url, "--path"]) == 0
    assert capsys.readouterr().out.strip() == url


def test_inspect_fetches_and_inspects(store_url, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DP_CKPT_STAGING", str(tmp_path / "cache"))
    assert main(["resolve", "latest", "--dir", store_url, "--path"]) == 0
    url = capsys.readouterr().out.strip()
    assert main(["inspect", url, "--json"]) == 0
    found = strict(capsys.readouterr().out)
    assert found["url"] == url and found["record"] == "ok"


def test_prune_keeps_the_newest_and_deletes_the_rest(store_url, capsys):
    assert main(["prune", store_url, "--keep-last", "1", "--dry-run"]) == 0
    assert "would remove 2" in capsys.readouterr().out
    assert main(["prune", store_url, "--keep-last", "1"]) == 0
    storage = storage_for(store_url)
    head, _ = heads.read(storage)
    assert [e.step for e in head.family("model.ckpt").kept] == [3]
    keys = {i.key for i in storage.list("")}
    assert not any(k.endswith("model.ckpt-1.h5") for k in keys)


def test_sync_down_and_up_again(store_url, capsys, tmp_path, pm):
    local = tmp_path / "copy"
    assert main(["sync", store_url, str(local)]) == 0
    assert "copied 3 checkpoint(s)" in capsys.readouterr().out
    assert committed_steps(local) == [1, 2, 3]
    assert (local / "checkpoint").read_text() == "model.ckpt-3.h5"
    # and up into a new remote store (memory: sync runs in this process)
    target = f"memory://up{secrets.token_hex(3)}/run"
    assert main(["sync", str(local), target]) == 0
    assert "all verified" in capsys.readouterr().out
    head, _ = heads.read(MemoryStorage(target))
    assert [e.step for e in head.family("model.ckpt").kept] == [1, 2, 3]
    assert head.family("model.ckpt").published.step == 3
    # a second sync sends nothing
    assert main(["sync", str(local), target, "--json"]) == 0
    assert strict(capsys.readouterr().out)["copied"] == []


def test_two_local_or_two_remote_are_refused_in_one_line(tmp_path, capsys):
    assert main(["sync", str(tmp_path), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "between a directory and a remote store" in err
