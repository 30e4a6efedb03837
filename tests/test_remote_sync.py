"""``dp-ckpt sync DIR URL`` into a URL that already holds a store (rule 46).

Another run's store there is archived first, as a fresh run archives
(``U/archive/<UTC>.json``), so no family mixes two runs and nothing of it is
deleted; the same run's store gets what it lacks, and its latest never moves
back to an older step; a step both hold with other bytes is refused in one
line; a corrupt source checkpoint is one line naming it.
"""

from __future__ import annotations

import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import committed_paths, make_payload, open_manager, remote_store

from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.remote import head as heads

PREFIX = "model.ckpt"


@pytest.fixture
def dest():
    bucket = f"y{secrets.token_hex(4)}"
    yield MemoryStorage(f"memory://{bucket}/run")
    forget(bucket)


def _remote_run(pm, tmp_path, storage, steps, *, salt=0):
    with remote_store(pm, tmp_path / f"w{secrets.token_hex(2)}", storage, keep=0) as s:
        for step in steps:
            s.save(step, make_payload(step + salt))
            s.remote.flush(60)


def _local_run(directory, steps, *, salt=0):
    with open_manager(directory, "hdf5", max_keep=0) as manager:
        for step in steps:
            manager.save(step, make_payload(step + salt))
    return directory


def _objects(storage):
    return {i.key: storage.get(i.key, 1 << 30)[0] for i in storage.list("")}


def _state(storage):
    head, _ = heads.read(storage)
    state = head.family(PREFIX)
    return head, [e.step for e in state.kept], state.published.step


def test_another_runs_store_is_archived_first(pm, tmp_path, dest, capsys):
    _remote_run(pm, tmp_path, dest, [10, 20, 30], salt=1000)
    before = _objects(dest)
    source = _local_run(tmp_path / "a", [1, 2])
    assert main(["sync", str(source), dest.url]) == 0
    captured = capsys.readouterr()
    assert (
        "archived in memory://" in captured.err and "steps 10, 20, 30" in captured.err
    )
    head, kept, latest = _state(dest)
    assert kept == [1, 2] and latest == 2  # one run per family
    (archive,) = head.archives
    archived = heads.Head.parse(dest.get(archive)[0], archive)
    assert [e.step for e in archived.family(PREFIX).kept] == [10, 20, 30]
    after = _objects(dest)
    for key, data in before.items():  # nothing of the other run is gone
        if key not in ("HEAD", "LEASE"):
            assert after.get(key) == data, key


def test_the_same_run_gets_what_it_lacks_and_latest_never_goes_back(pm, tmp_path, dest):
    _remote_run(pm, tmp_path, dest, [1, 2, 3])
    before = _objects(dest)
    # a node's staging directory that holds the same steps 1 and 2, and one
    # the store lacks (1.5 is not a step: 0 is)
    source = _local_run(tmp_path / "a", [0, 1, 2])
    assert main(["sync", str(source), dest.url]) == 0
    head, kept, latest = _state(dest)
    assert kept == [0, 1, 2, 3] and latest == 3 and head.archives == ()
    after = _objects(dest)
    assert all(
        after.get(k) == v for k, v in before.items() if k not in ("HEAD", "LEASE")
    )


def test_a_continuation_is_sent_without_archiving(pm, tmp_path, dest):
    _remote_run(pm, tmp_path, dest, [1, 2])
    source = _local_run(
        tmp_path / "a", [3, 4]
    )  # staging kept only what it could not send
    assert main(["sync", str(source), dest.url]) == 0
    head, kept, latest = _state(dest)
    assert kept == [1, 2, 3, 4] and latest == 4 and head.archives == ()


def test_an_older_run_is_archived_not_mixed(pm, tmp_path, dest):
    """Another run whose steps lie below the destination's newest: archived, so
    latest is the copied run's, never a mix that moves back inside one run."""
    _remote_run(pm, tmp_path, dest, [5, 6], salt=1000)
    source = _local_run(tmp_path / "a", [1, 2])
    assert main(["sync", str(source), dest.url]) == 0
    head, kept, latest = _state(dest)
    assert kept == [1, 2] and latest == 2 and len(head.archives) == 1


def test_a_step_held_with_other_bytes_is_refused_in_one_line(
    pm, tmp_path, dest, capsys
):
    _remote_run(pm, tmp_path, dest, [1, 2, 3])
    before = _objects(dest)
    source = _local_run(tmp_path / "a", [1])
    _local_run(source, [2], salt=1000)  # step 2 of another branch
    assert main(["sync", str(source), dest.url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step 2" in err and "nothing was copied" in err
    after = _objects(dest)
    fenced = ("HEAD", "LEASE")  # the sync took the lease and fenced HEAD
    assert {k: v for k, v in after.items() if k not in fenced} == {
        k: v for k, v in before.items() if k not in fenced
    }
    _, kept, latest = _state(dest)
    assert kept == [1, 2, 3] and latest == 3


@pytest.mark.parametrize("spoil", ["flipped", "truncated"])
def test_a_corrupt_source_checkpoint_is_one_line_naming_it(
    pm, tmp_path, dest, capsys, spoil
):
    source = _local_run(tmp_path / "a", [1, 2])
    bad = committed_paths(source)[1]
    data = bad.read_bytes()
    bad.write_bytes(
        data[:-1] + bytes([data[-1] ^ 1]) if spoil == "flipped" else data[:9]
    )
    code = main(["sync", str(source), dest.url])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 1
    lines = [line for line in out.splitlines() if str(bad) in line]
    assert len(lines) == 1, out
    _, kept, latest = _state(dest)
    assert kept == [2] and latest == 2
