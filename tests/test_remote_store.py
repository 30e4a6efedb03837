"""The remote store on the in-process storage: layout, uploads, restarts, retention.

The storage checks its conditions under a lock (the memory storage of the tests' doubles),
so these tests can race writers and inject a failure at any call; the same
store runs against a real S3 server in ``test_remote_s3.py``.
"""

from __future__ import annotations

import json
import logging
import re
import secrets

import numpy as np
import pytest
from doubles.memory import MemoryStorage, forget
from helpers import make_payload, payload_mismatches, remote_store

from dp_ckpt_plugin.checkpoint.layout import record_name, record_target
from dp_ckpt_plugin.errors import CheckpointWriteError, RestartNotFoundError
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import HEAD_KEY, LEASE_KEY, record_key

PREFIX = "model.ckpt"


def head_of(storage):
    head, _ = heads.read(storage)
    return head


def kept_steps(storage, prefix=PREFIX):
    return [e.step for e in head_of(storage).family(prefix).kept]


def save_steps(store, steps):
    """Save and upload each step (a backlog would send only the newest)."""
    for step in steps:
        store.save(step, make_payload(step))
        store.remote.flush(30)


def test_each_checkpoint_goes_payload_record_head(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "s", mem, keep=2) as store:
        save_steps(store, [1, 2, 3])
        head = head_of(mem)
        state = head.family(PREFIX)
        assert [e.step for e in state.kept] == [2, 3]
        assert state.published.step == 3
        # every object is HEAD, the lease, or named by HEAD: nothing else is left
        keys = {i.key for i in mem.list("")}
        assert keys == {HEAD_KEY, LEASE_KEY} | head.referenced()
        for entry in state.kept:
            data, _ = mem.get(entry.key, 1 << 30)
            staged = (tmp_path / "s" / entry.name).read_bytes()
            assert data == staged
            record = json.loads(mem.get(record_key(entry.key))[0])
            assert (record["step"], record["size"], record["digest"]) == (
                entry.step,
                entry.size,
                entry.digest,
            )
        assert head.epoch == 1


def test_a_new_node_restarts_from_latest_and_continues(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem) as store:
        save_steps(store, [1, 2])
    with remote_store(pm, tmp_path / "b", mem) as store:
        found = store.resolve("latest")
        assert found.step == 2 and found.path.parent == tmp_path / "b"
        assert found.source.entry.key == "e000001/model.ckpt-2.h5"
        assert payload_mismatches(store.load(found), 2) == []
        save_steps(store, [3])
    head = head_of(mem)
    assert head.epoch == 2
    assert [e.key for e in head.family(PREFIX).kept] == [
        "e000001/model.ckpt-2.h5",
        "e000002/model.ckpt-3.h5",
    ]


def test_a_steady_save_makes_payload_record_head_and_no_listing(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "s", mem, keep=2) as store:
        save_steps(store, [1, 2, 3])
        before = dict(mem.counts)
        save_steps(store, [4])
        calls = {k: v - before.get(k, 0) for k, v in mem.counts.items()}
        calls = {k: v for k, v in calls.items() if v}
    # one payload, one record, one HEAD swap; retention removes step 2's two objects
    assert calls == {"put": 1, "put_if_absent": 1, "put_if_match": 1, "delete": 2}


def test_latest_costs_as_many_calls_with_2000_kept_as_with_10(pm, tmp_path):
    costs = {}
    for count in (10, 2000):
        bucket = f"n{count}{secrets.token_hex(3)}"
        storage = MemoryStorage(f"memory://{bucket}/run")
        with remote_store(pm, tmp_path / f"w{count}", storage, keep=0) as store:
            store.save(1, make_payload(1))
            store.remote.flush(30)
            entry = head_of(storage).family(PREFIX).kept[0]
            # the other entries: HEAD names them; their objects are not read
            fake = [
                heads.Entry(
                    f"e000001/model.ckpt-{s}.h5",
                    f"model.ckpt-{s}.h5",
                    s,
                    1,
                    entry.digest,
                )
                for s in range(2, count + 1)
            ]
            head, version = heads.read(storage)
            state = head.family(PREFIX)
            grown = head._with(
                PREFIX, heads.FamilyState(tuple([*state.kept, *fake]), state.latest)
            )
            storage.put_if_match(HEAD_KEY, grown.to_bytes(), version)
        with remote_store(pm, tmp_path / f"r{count}", storage) as store:
            store.open()  # the lease and the fence of HEAD, once per run
            keys: list[str] = []
            storage.before("*", keys.append)
            found = store.resolve("latest")
            storage.clear_hooks()
            # the lease's heartbeat renews on its own clock, whatever resolve does
            costs[count] = [k for k in keys if k != "LEASE"]
            assert found.step == 1
        forget(bucket)
    assert len(costs[10]) == len(costs[2000]) == 3  # HEAD, record, payload
    assert costs[10][0] == "HEAD"


def test_never_moves_latest_back_to_an_older_step(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "s", mem, keep=0) as store:
        save_steps(store, [5])
        save_steps(store, [3])  # a late save of an earlier step
        state = head_of(mem).family(PREFIX)
        assert state.published.step == 5
        assert [e.step for e in state.kept] == [3, 5]


def test_a_fresh_run_archives_the_earlier_one_and_deletes_nothing(
    pm, tmp_path, mem, caplog
):
    with remote_store(pm, tmp_path / "a", mem) as store:
        save_steps(store, [1, 2])
    before = {i.key for i in mem.list("")}
    with (
        caplog.at_level(logging.INFO, "dp_ckpt_plugin"),
        remote_store(pm, tmp_path / "b", mem) as store,
    ):
        save_steps(store, [1])
    head = head_of(mem)
    assert len(head.archives) == 1
    archived = heads.Head.parse(mem.get(head.archives[0])[0], "archive")
    assert [e.step for e in archived.family(PREFIX).kept] == [1, 2]
    assert before - {HEAD_KEY, LEASE_KEY} <= {i.key for i in mem.list("")}
    assert [e.key for e in head.family(PREFIX).kept] == ["e000002/model.ckpt-1.h5"]
    assert "archived 2 checkpoint(s) of an earlier run" in caplog.text


def test_a_restart_protects_its_start_and_archives_what_lies_above(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        save_steps(store, [1, 2, 3])
    with remote_store(pm, tmp_path / "b", mem, keep=1) as store:
        store.resolve("model.ckpt-2.h5")
        save_steps(store, [3])
        kept = head_of(mem).family(PREFIX).kept
        # step 3 of the earlier run is archived; step 2 (the start) was kept
        # until step 3 of this run was committed, then retention removed it
        assert [(e.key, e.step) for e in kept] == [("e000002/model.ckpt-3.h5", 3)]
        archived = heads.Head.parse(mem.get(head_of(mem).archives[0])[0], "a")
        assert [e.step for e in archived.family(PREFIX).kept] == [3]


def test_two_writers_racing_exactly_one_wins(pm, tmp_path, mem):
    import threading

    barrier = threading.Barrier(2, timeout=10)
    seen = set()

    def both_read_first(key):
        if key == LEASE_KEY and threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            barrier.wait()

    mem.before("get", both_read_first)
    stores = [remote_store(pm, tmp_path / f"w{i}", mem) for i in range(2)]
    outcomes = [None, None]

    def open_one(i):
        try:
            stores[i].open()
            outcomes[i] = "opened"
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    mem.clear_hooks()
    winners = [o for o in outcomes if o == "opened"]
    losers = [o for o in outcomes if o != "opened"]
    try:
        assert len(winners) == 1, outcomes
        assert "is in use by another run" in str(losers[0])
        assert "\n" not in str(losers[0])
    finally:
        for s in stores:
            s.close()


def test_a_zombie_writer_after_takeover_moves_nothing(pm, tmp_path, mem, monkeypatch):
    zombie = remote_store(pm, tmp_path / "z", mem, keep=1, ttl=5)
    save_steps(zombie, [1, 2])
    # the zombie stops renewing (paused); time passes on the new writer's clock
    zombie.remote.lease._stop.set()
    import time as _time

    later = _time.time() + 60
    newer = remote_store(pm, tmp_path / "n", mem, keep=1, ttl=5)
    newer.remote.lease._wall = lambda: later
    found = newer.resolve("latest")
    assert found.step == 2
    taken = head_of(mem)
    assert taken.epoch == 2
    # the zombie wakes and saves: it is refused, and HEAD and step 2 stay
    zombie.save(3, make_payload(3))
    with pytest.raises(CheckpointWriteError, match="another run took the store over"):
        zombie.remote.flush(30)
    with pytest.raises(CheckpointWriteError, match="moves nothing there any more"):
        zombie.save(4, make_payload(4))
    after = head_of(mem)
    assert after.seq == taken.seq and after.epoch == 2
    assert all(mem.head(k) is not None for k in after.referenced())
    save_steps(newer, [3])
    assert kept_steps(mem) == [3]
    newer.close()
    zombie.close()  # its error surfaced once, at the save it stopped
    assert (
        head_of(mem).seq > after.seq and json.loads(mem.get(LEASE_KEY)[0])["released"]
    )


def test_a_zombie_paused_before_its_deletes_removes_nothing_the_new_writer_needs(
    pm, tmp_path, mem
):
    import threading
    import time

    zombie = remote_store(pm, tmp_path / "z", mem, keep=1)
    save_steps(zombie, [1])
    paused, go = threading.Event(), threading.Event()

    def pause(key):
        paused.set()
        go.wait(30)

    mem.before("delete", pause)
    zombie.save(2, make_payload(2))  # its swap drops step 1, then it pauses
    assert paused.wait(30)
    mem.clear_hooks()
    newer = remote_store(pm, tmp_path / "n", mem, keep=1)
    # the zombie's lease runs out: unchanged for its time to live on the
    # newer writer's clock (the zombie's heartbeat is not due within it)
    clock = [0.0]
    newer.remote.lease._wall = lambda: time.time() + 3600
    newer.remote.lease._clock = lambda: clock[0]
    newer.remote.lease._sleep = lambda s: clock.__setitem__(0, clock[0] + s)
    found = newer.resolve("latest")
    go.set()
    zombie.remote.flush(30)
    assert found.step == 2
    head = head_of(mem)
    assert all(mem.head(k) is not None for k in head.referenced())
    newer.close()
    zombie.close()


def test_uploads_falling_behind_say_which_steps_they_skipped(pm, tmp_path, mem, caplog):
    import threading

    go = threading.Event()
    mem.before("put", lambda key: go.wait(30))
    with (
        caplog.at_level(logging.WARNING, "dp_ckpt_plugin"),
        remote_store(pm, tmp_path / "s", mem, keep=0) as store,
    ):
        for step in range(1, 6):
            store.save(step, make_payload(step))
        go.set()
        store.remote.flush(30)
        kept = kept_steps(mem)
    said = set()
    for record in caplog.records:
        found = re.search(r"step\(s\) ([0-9, ]+), committed", record.getMessage())
        if found:
            said |= {int(s) for s in found.group(1).split(",")}
    assert kept[-1] == 5
    assert said, "no line said which steps were skipped"
    # every committed step is in HEAD or named in a line as skipped, none both
    assert set(kept) | said == {1, 2, 3, 4, 5}
    assert not set(kept) & said


def test_staged_checkpoints_a_crash_left_unuploaded_go_up_at_the_next_open(
    pm, tmp_path, mem
):
    store = remote_store(pm, tmp_path / "s", mem, keep=0, upload_wait=0.5)
    mem.fail("put", times=1000)
    store.save(1, make_payload(1))
    with pytest.raises(CheckpointWriteError, match="could not be uploaded"):
        store.close()
    mem.clear_hooks()
    assert head_of(mem).empty
    with remote_store(pm, tmp_path / "s", mem, keep=0) as again:
        again.open()
        again.remote.flush(30)
        assert kept_steps(mem) == [1]
        found = again.resolve("latest")
        assert found.step == 1


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "fetched"])
def test_a_remote_restart_reads_its_local_record_once(
    pm, tmp_path, mem, monkeypatch, staged
):
    """Fetched or already staged, the copy's record is read once on the way in."""
    from dp_ckpt_plugin.storage.local import LocalStorage

    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        save_steps(store, [1, 2])
    read, read_small = [], LocalStorage.read_small

    def counted(self, path, limit):
        if record_target(path.name) is not None:
            read.append(path.name)
        return read_small(self, path, limit)

    with remote_store(pm, tmp_path / ("a" if staged else "b"), mem) as store:
        store.open()  # its catalogue is read here, before the restart
        monkeypatch.setattr(LocalStorage, "read_small", counted)
        found = store.resolve("latest")
    assert found.step == 2 and found.rule == "remote"
    assert read == [record_name(found.path.name)]


def test_a_corrupt_newest_payload_falls_back_with_a_warning(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        save_steps(store, [1, 2])
    newest = head_of(mem).family(PREFIX).published
    data, _ = mem.get(newest.key, 1 << 30)
    mem.put(newest.key, data[:-1] + bytes([data[-1] ^ 1]))
    with remote_store(pm, tmp_path / "b", mem) as store:
        found = store.resolve("latest")
        assert found.step == 1 and found.fell_back
        assert any("does not match its commit record" in w for w in found.warnings)
        assert not (tmp_path / "b" / newest.name).exists()


def test_nothing_found_names_the_url(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "s", mem) as store:
        with pytest.raises(
            RestartNotFoundError, match=r"memory://.*holds no committed"
        ):
            store.resolve("latest")
        with pytest.raises(RestartNotFoundError, match="keeps no checkpoint named"):
            save_steps(store, [1])
            store.resolve("model.ckpt-7.h5")


def test_an_endpoint_ignoring_conditions_is_said_in_one_line(
    pm, tmp_path, caplog, monkeypatch
):
    from dp_ckpt_plugin.remote import probe

    class Lax(MemoryStorage):
        def put_if_absent(self, key, data):
            return self.put(key, data)

    monkeypatch.setattr(probe, "_PROBED", {})  # probed afresh
    lax = Lax(f"memory://lax{secrets.token_hex(3)}/run")
    with (
        caplog.at_level(logging.WARNING, "dp_ckpt_plugin"),
        remote_store(pm, tmp_path / "s", lax) as store,
    ):
        save_steps(store, [1])
    lines = [
        r.getMessage() for r in caplog.records if "does not enforce" in r.getMessage()
    ]
    assert (
        len(lines) == 1
        and "a second create of the same object was accepted" in lines[0]
    )


def test_saves_restore_exactly_through_the_remote_store(pm, tmp_path, mem):
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "n": np.int64(7)}
    with remote_store(pm, tmp_path / "a", mem) as store:
        store.save(9, state)
        store.remote.flush(30)
    with remote_store(pm, tmp_path / "b", mem) as store:
        back = store.load(store.resolve("latest"))
    assert back["w"].tobytes() == state["w"].tobytes() and back["n"] == 7


def test_a_new_writer_removes_only_what_dead_writers_left_unnamed(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem, keep=0) as store:
        save_steps(store, [1, 2])
    # a writer of epoch 1 died mid-upload: a payload and a record HEAD never named
    mem.put("e000001/model.ckpt-3.h5", b"torn")
    mem.put("e000001/.model.ckpt-3.h5.commit.json", b"{}")
    mem.put("notes/by-a-user.txt", b"mine")
    named_before = head_of(mem).referenced()
    with remote_store(pm, tmp_path / "b", mem, keep=0) as store:
        store.open()
        store.remote.flush(30)
        keys = {i.key for i in mem.list("")}
    assert "e000001/model.ckpt-3.h5" not in keys
    assert "e000001/.model.ckpt-3.h5.commit.json" not in keys
    assert "notes/by-a-user.txt" in keys  # not under an epoch's folder: never touched
    assert named_before <= keys


def test_recovery_keeps_what_an_archive_names(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "a", mem) as store:
        save_steps(store, [1, 2])
    with remote_store(pm, tmp_path / "b", mem) as store:
        save_steps(store, [1])  # a fresh run: steps 1 and 2 of epoch 1 are archived
    with remote_store(pm, tmp_path / "c", mem) as store:
        store.open()
        store.remote.flush(30)
    head = head_of(mem)
    archived = heads.Head.parse(mem.get(head.archives[0])[0], "archive")
    assert all(mem.head(k) is not None for k in archived.referenced())


def test_the_manager_takes_a_url(tmp_path, mem):
    from helpers import plugin_manager

    from dp_ckpt_plugin import CheckpointManager

    with CheckpointManager(
        mem.url, staging=tmp_path / "node", pm=plugin_manager(), max_keep=2
    ) as manager:
        for step in (1, 2, 3):
            manager.save(step, make_payload(step))
            assert manager.flush(30)
        assert manager.directory.parent.parent == tmp_path / "node"
    assert kept_steps(mem) == [2, 3]
    with CheckpointManager(
        mem.url, staging=tmp_path / "other", pm=plugin_manager()
    ) as m:
        restored = m.restore("latest")
        assert restored.step == 3 and payload_mismatches(restored.state, 3) == []


def test_a_fenced_writer_says_its_line_once(pm, tmp_path, mem, caplog, monkeypatch):
    """Its uploader, its heartbeat, its next save and the end of the run meet the
    takeover; the line is said once."""
    import time
    from types import SimpleNamespace

    from dp_ckpt_plugin.deepmd import cli

    caplog.set_level(logging.INFO, "dp_ckpt_plugin")
    zombie = remote_store(pm, tmp_path / "z", mem, keep=1, ttl=0.6)
    save_steps(zombie, [1])
    lease = zombie.remote.lease
    lease._stop.set()  # paused: it renews no more
    lease._thread.join()
    lease._thread = None
    newer = remote_store(pm, tmp_path / "n", mem, keep=1, ttl=0.6)
    newer.remote.lease._wall = lambda: time.time() + 60
    assert newer.resolve("latest").step == 1
    # it wakes: the upload of its next save meets the takeover first
    zombie.save(2, make_payload(2))
    with pytest.raises(CheckpointWriteError) as at_flush:
        zombie.remote.flush(30)
    lease.start_heartbeat()  # then its heartbeat
    time.sleep(0.5)
    with pytest.raises(CheckpointWriteError) as at_save:  # then its next save
        zombie.save(3, make_payload(3))
    assert at_save.value is at_flush.value and at_save.value.said

    def train(flags, host):  # the end of the run: dp's front gets the error
        raise at_save.value

    monkeypatch.setattr(cli, "run_train", train)
    with pytest.raises(SystemExit) as ended:
        cli.run_command(SimpleNamespace(command="train"), "pt")
    assert ended.value.code == 1
    said = [
        r.getMessage()
        for r in caplog.records
        if "moves nothing there any more" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "another run took the store over" in said[0]
    newer.close()
    zombie.close()


def test_a_remote_store_is_the_replica_a_store_takes_and_a_local_one_has_none(
    pm, tmp_path, mem
):
    from dp_ckpt_plugin.remote.factory import open_remote
    from dp_ckpt_plugin.remote.fetch import Found
    from dp_ckpt_plugin.resolution.sources import Origin
    from dp_ckpt_plugin.store.core import CheckpointStore
    from dp_ckpt_plugin.store.replica import Replica

    directory, remote = open_remote(mem.url, format="hdf5", directory=tmp_path / "s")
    assert isinstance(remote, Replica) and directory == tmp_path / "s"
    assert remote.url == mem.url and remote.epoch is None
    assert CheckpointStore(tmp_path / "local", format="hdf5", pm=pm).remote is None
    with remote_store(pm, tmp_path / "a", mem) as store:
        save_steps(store, [1])
    with remote_store(pm, tmp_path / "b", mem) as store:
        found = store.resolve("latest")
        assert isinstance(found.source, Found) and isinstance(found.source, Origin)
        assert store.context().remote.storage.url == mem.url
