"""HEAD at any size (rule 48): catalogue segments keep a save's swap small.

A keep-all store's older entries move out of HEAD into immutable catalogue
segments (``catalogue/e<epoch>-<n>.json``); ``latest`` stays three requests
and a save's swap of HEAD stays the same size whether the store keeps 10,
2,000 or 100,000 checkpoints; every reader (``ls``, ``verify``, ``resolve``,
``prune``, ``sync``, recovery) reads such a store. The large stores are
built through the module's own functions (as the writer builds them), with
objects only for the checkpoints a test reads; the figures are printed for
``docs/performance.md``.
"""

from __future__ import annotations

import json
import secrets

from doubles.memory import MemoryStorage, forget
from head_support import grow
from helpers import committed_steps, make_payload, open_manager, remote_store

from dp_ckpt_plugin.checkpoint.digests import digest_of_view
from dp_ckpt_plugin.checkpoint.records import CommitRecord
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.remote import catalogue
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import HEAD_KEY, SEGMENT, parse_key, record_key

PREFIX = "model.ckpt"
BYTES = b"x"
DIGEST = digest_of_view(memoryview(BYTES))


def _entry(step: int) -> heads.Entry:
    name = f"{PREFIX}-{step}.h5"
    return heads.Entry(f"e000001/{name}", name, step, len(BYTES), DIGEST)


def _commit(storage, entry: heads.Entry) -> None:
    """The payload and record of ``entry``, for a test that reads it."""
    storage.put(entry.key, BYTES)
    record = CommitRecord(entry.name, entry.step, PREFIX, "hdf5", 1, DIGEST, 1.0)
    storage.put(record_key(entry.key), record.to_json().encode("utf-8"))


def _grow(storage, count: int) -> None:
    """Make HEAD keep steps 1..count-1 besides its newest, as the writer would."""
    grow(storage, PREFIX, count, _entry)


def _figures(pm, tmp_path, count):
    """``latest``'s calls and a save's calls and HEAD bytes, with ``count`` kept."""
    storage = MemoryStorage(f"memory://f{count}{secrets.token_hex(3)}/run")
    with remote_store(pm, tmp_path / f"w{count}", storage, keep=0) as store:
        store.save(count, make_payload(count))
        store.remote.flush(30)
    _grow(storage, count)
    with remote_store(pm, tmp_path / f"r{count}", storage, keep=0) as store:
        store.open()  # the lease and the fence of HEAD, once per run
        assert store.remote.recovered.wait(60)  # its listing, on its own thread
        keys: list[str] = []
        storage.before("*", keys.append)
        found = store.resolve("latest")
        storage.clear_hooks()
        latest = [k for k in keys if k != "LEASE"]
        assert found.step == count
        sent = []
        swap = storage.put_if_match

        def measured(key, data, version):
            if key == HEAD_KEY:
                sent.append(len(data))
            return swap(key, data, version)

        storage.put_if_match = measured
        before = dict(storage.counts)
        store.save(count + 1, make_payload(count + 1))
        store.remote.flush(30)
        calls = {k: storage.counts[k] - before.get(k, 0) for k in storage.counts}
        del storage.put_if_match
    return storage, latest, {k: v for k, v in calls.items() if v}, sent


def test_a_keep_all_store_of_100000_costs_what_one_of_10_does(pm, tmp_path, capsys):
    figures = {}
    for count in (10, 2_000, 100_000):
        storage, latest, calls, sent = _figures(pm, tmp_path, count)
        figures[count] = (len(latest), calls, sent)
        assert latest[0] == HEAD_KEY and len(latest) == 3  # HEAD, record, payload
        assert calls == {"put": 1, "put_if_absent": 1, "put_if_match": 1}
        if count == 100_000:
            head, _ = heads.read(storage)
            assert catalogue.expand(storage, head).family(PREFIX).kept[0].step == 1
            assert len(expanded_steps(storage)) == 100_001
        forget(storage.url.split("/")[2])
    with capsys.disabled():
        for count, (reads, calls, sent) in figures.items():
            print(
                f"\n{count} kept: latest {reads} requests; a save {calls}, HEAD {sent[0]} bytes"
            )
    sizes = [figures[c][2][0] for c in (10, 2_000, 100_000)]
    # the swap's bytes: what retention may still delete, the recent entries,
    # a few dozen segment names; never what the store keeps
    assert max(sizes) < 100_000
    assert sizes[2] < 2 * sizes[1]


def expanded_steps(storage):
    head, _ = heads.read(storage)
    return [e.step for e in catalogue.expand(storage, head).family(PREFIX).kept]


def test_every_reader_reads_a_store_of_100000(pm, tmp_path, mem, capsys):
    with remote_store(pm, tmp_path / "w", mem, keep=0) as store:
        store.save(100_000, make_payload(100_000))
        store.remote.flush(30)
    _grow(mem, 100_000)
    for step in (5, 77_777):
        _commit(mem, _entry(step))
    assert main(["ls", mem.url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["families"][0]["checkpoints"]
    assert len(listed) == 100_000 and listed[4]["step"] == 5
    assert main(["verify", mem.url, "--size-only", "--json"]) == 1  # no objects: built
    checked = json.loads(capsys.readouterr().out)
    assert len(checked["checkpoints"]) == 100_000 and checked["sound"] == 3
    for step in (5, 77_777):
        name = f"{PREFIX}-{step}.h5"
        assert main(["resolve", name, "--dir", mem.url, "--path"]) == 0
        assert capsys.readouterr().out.strip() == f"{mem.url}/e000001/{name}"
    with remote_store(pm, tmp_path / "n", mem) as store:  # a run resumes from one
        assert store.resolve(f"{PREFIX}-77777.h5").step == 77_777
    assert main(["prune", mem.url, "--keep-last", "10", "--dry-run"]) == 0
    assert "would remove 99990" in capsys.readouterr().out.replace(",", "")
    source = tmp_path / "local"
    with open_manager(source, "hdf5", max_keep=0) as manager:
        manager.save(100_001, make_payload(1))
    assert main(["sync", str(source), mem.url]) == 0
    assert "copied 1 checkpoint(s)" in capsys.readouterr().out
    assert len(expanded_steps(mem)) == 100_001


def test_saves_of_a_keep_all_store_move_older_entries_into_segments(pm, tmp_path, mem):
    """The writer itself: past ``SPILL`` settled entries, a segment; a keep-last
    store never makes one; every reader sees every entry; prune rewrites."""
    steps = range(1, catalogue.SPILL + catalogue.RECENT + 3)
    with remote_store(pm, tmp_path / "w", mem, keep=0) as store:
        for step in steps:
            store.save(step, make_payload(step))
            store.remote.flush(30)
    head, _ = heads.read(mem)
    state = head.family(PREFIX)
    assert len(state.segments) == 1 and state.segments[0].count == catalogue.SPILL
    assert len(state.kept) == len(steps) - catalogue.SPILL
    assert parse_key(state.segments[0].key).kind == SEGMENT
    assert expanded_steps(mem) == list(steps)
    # recovery by a later writer keeps the segment and everything it names
    with remote_store(pm, tmp_path / "n", mem, keep=0) as store:
        assert store.resolve(f"{PREFIX}-3.h5").step == 3  # named: read from its segment
        store.remote.flush(30)
    assert expanded_steps(mem) == list(steps)
    assert mem.head(state.segments[0].key) is not None
    local = tmp_path / "copy"
    assert main(["sync", mem.url, str(local)]) == 0
    assert committed_steps(local) == list(steps)
    assert main(["prune", mem.url, "--keep-last", "5"]) == 0
    assert expanded_steps(mem) == list(steps)[-5:]
    keys = {i.key for i in mem.list("")}
    assert not any(parse_key(k).kind == SEGMENT for k in keys if parse_key(k))
    assert not any(k.endswith(f"{PREFIX}-3.h5") for k in keys)


def test_a_save_that_fills_a_level_names_it_by_one_segment_of_the_next(
    pm, tmp_path, mem
):
    count = catalogue.SPILL * catalogue.FANOUT - 1
    with remote_store(pm, tmp_path / "w", mem, keep=0) as store:
        store.save(count + catalogue.SPILL + catalogue.RECENT, make_payload(1))
        store.remote.flush(30)
    newest = count + catalogue.SPILL + catalogue.RECENT
    head, version = heads.read(mem)
    older = [_entry(s) for s in range(1, newest)]
    segments = tuple(
        catalogue.write_segment(mem, 1, i, PREFIX, older[at : at + catalogue.SPILL])
        for i, at in enumerate(
            range(0, catalogue.SPILL * (catalogue.FANOUT - 1), catalogue.SPILL)
        )
    )
    state = head.family(PREFIX)
    rest = older[catalogue.SPILL * (catalogue.FANOUT - 1) :]
    kept = tuple(sorted([*rest, *state.kept], key=lambda e: e.step))
    grown = head._with(
        PREFIX, heads.FamilyState(kept, state.latest, state.pointer, (), segments)
    )
    mem.put_if_match(HEAD_KEY, grown.to_bytes(), version)
    with remote_store(pm, tmp_path / "n", mem, keep=0) as store:
        store.resolve("latest")
        store.save(newest + 1, make_payload(2))
        store.remote.flush(30)
    state = heads.read(mem)[0].family(PREFIX)
    assert [s.level for s in state.segments] == [1]
    assert state.segments[0].count == catalogue.SPILL * catalogue.FANOUT
    assert expanded_steps(mem) == [*range(1, newest), newest, newest + 1]
    # a later writer's recovery keeps every segment a segment names
    with remote_store(pm, tmp_path / "later", mem, keep=0) as store:
        store.open()
        assert store.remote.recovered.wait(60)
    assert all(mem.head(s.key) is not None for s in segments)
    assert expanded_steps(mem) == [*range(1, newest), newest, newest + 1]


def test_recovery_removes_an_older_writers_segment_nothing_names(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "w", mem, keep=0) as store:
        store.save(1, make_payload(1))
        store.remote.flush(30)
        # a segment written, its swap never made (the writer was cut off)
        stray = catalogue.write_segment(mem, 1, 7, PREFIX, [_entry(0)])
    with remote_store(pm, tmp_path / "n", mem, keep=0) as store:
        store.open()
        assert store.remote.recovered.wait(60)
    assert mem.head(stray.key) is None
    assert expanded_steps(mem) == [1]


def test_a_keep_last_store_makes_no_segment(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "w", mem, keep=2) as store:
        for step in range(1, 6):
            store.save(step, make_payload(step))
            store.remote.flush(30)
    assert heads.read(mem)[0].family(PREFIX).segments == ()


def test_a_fresh_run_archives_the_segments_and_recovery_keeps_them(pm, tmp_path, mem):
    with remote_store(pm, tmp_path / "w", mem, keep=0) as store:
        store.save(300, make_payload(300))
        store.remote.flush(30)
    _grow(mem, 300)
    _commit(mem, _entry(5))  # an entry in a segment, with its objects
    before = heads.read(mem)[0].family(PREFIX).segments
    assert before
    with remote_store(pm, tmp_path / "fresh", mem, keep=0) as store:
        store.save(1, make_payload(1))  # not a restart: the earlier run is archived
        store.remote.flush(30)
    head, _ = heads.read(mem)
    assert head.family(PREFIX).segments == () and expanded_steps(mem) == [1]
    archived = heads.Head.parse(mem.get(head.archives[-1])[0], "archive")
    assert archived.family(PREFIX).segments == before
    with remote_store(pm, tmp_path / "later", mem, keep=0) as store:
        store.open()
        assert store.remote.recovered.wait(60)
    assert mem.head(_entry(5).key) is not None
    assert all(mem.head(s.key) is not None for s in before)
