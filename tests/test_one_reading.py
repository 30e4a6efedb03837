"""A checkpoint is opened once, verified from those bytes, and loaded from them.

Counted with the storage's ``counts`` (``payload_open``, ``payload_read``):
a restore, a host's restart preflight, a freeze's check of its heads and
``dp-ckpt inspect`` each open the payload once and read it once. A file
replaced on disk after that reading is never loaded; one replaced before it
is refused by the digest of its record.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import (
    assert_same,
    committed_paths,
    fill_store,
    make_payload,
    needs_torch,
    open_manager,
    plugin_manager,
)

from dp_ckpt_plugin.checkpoint.layout import Family, record_name, record_target
from dp_ckpt_plugin.commands.inspect import inspect_file
from dp_ckpt_plugin.errors import CorruptCheckpointError
from dp_ckpt_plugin.plugin.hooks import Hooks
from dp_ckpt_plugin.resolution import ResolveContext, payload_of, resolve_restart
from dp_ckpt_plugin.storage.local import LocalStorage

FORMATS = ["hdf5", pytest.param("torch", marks=needs_torch)]


class SwapBeforeOpen(LocalStorage):
    """A storage under which ``victim`` is replaced by ``other`` just before it opens.

    The replacement comes between everything a resolution asked about the
    file (its record, its size) and the one opening of its bytes.
    """

    def __init__(self, root, victim: Path, other: Path) -> None:
        super().__init__(root)
        self.victim, self.other = victim, other

    def read_payload(self, path):
        if Path(path) == self.victim and self.other.exists():
            os.replace(self.other, self.victim)
        return super().read_payload(path)


def reading_counts(storage) -> tuple[int, int]:
    return storage.counts["payload_open"], storage.counts["payload_read"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("verify", ["size", "digest"])
def test_a_restore_opens_and_reads_the_payload_once(tmp_path, fmt, verify):
    with open_manager(tmp_path / "models", fmt, verify=verify) as m:
        for step in (1, 2):
            m.save(step, make_payload(step, fmt))
        m.store.storage.counts.clear()
        restored = m.restore("latest")
        assert restored.step == 2
        assert_same(restored.state, make_payload(2, fmt))
        assert reading_counts(m.store.storage) == (1, 1)
        assert m.store.storage.counts["payload_bytes"] == restored.path.stat().st_size
        assert restored.resolved.payload is None  # the bytes are not kept on


@pytest.mark.parametrize("verify", ["size", "digest"])
def test_a_restore_reads_the_commit_record_once(tmp_path, monkeypatch, verify):
    """The rule that finds the checkpoint and the front door share one reading."""
    read = []
    read_small = LocalStorage.read_small

    def counted(self, path, limit):
        if record_target(Path(path).name) is not None:
            read.append(Path(path).name)
        return read_small(self, path, limit)

    with open_manager(tmp_path / "models", "hdf5", verify=verify) as m:
        for step in (1, 2):
            m.save(step, make_payload(step, "hdf5"))
        monkeypatch.setattr(LocalStorage, "read_small", counted)
        restored = m.restore("latest")
    assert restored.step == 2
    assert read == [record_name(restored.path.name)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_replaced_after_it_was_read_is_not_loaded(tmp_path, fmt):
    directory = tmp_path / "models"
    fill_store(directory, [1, 2], fmt)
    with open_manager(directory, fmt, verify="digest") as m:
        found = m.store.resolve("latest", digest=True, load=True)
        # another file takes the name between the verification and the load
        with open_manager(tmp_path / "other", fmt) as other:
            impostor = other.save(2, make_payload(99, fmt))
        os.replace(impostor, found.path)
        assert_same(m.store.load(found), make_payload(2, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_replaced_before_it_was_read_is_refused(tmp_path, fmt):
    """What is read is what is verified: an impostor of the same size fails the digest."""
    directory = tmp_path / "models"
    fill_store(directory, [1, 2], fmt)
    victim = committed_paths(directory, fmt)[2]
    impostor = tmp_path / "impostor"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    impostor.write_bytes(bytes(data))
    storage = SwapBeforeOpen(directory, victim, impostor)
    ctx = ResolveContext(
        Family("model.ckpt", victim.suffix),
        store_dir=directory,
        digest=True,
        quarantine=False,
        storage=storage,
        load=True,
    )
    with pytest.raises(CorruptCheckpointError, match="does not match the blake3"):
        resolve_restart(Hooks(plugin_manager()), str(victim), ctx)
    assert reading_counts(storage) == (1, 1)


def test_latest_falls_back_past_a_file_replaced_before_it_was_read(tmp_path):
    directory = tmp_path / "models"
    fill_store(directory, [1, 2])
    with open_manager(tmp_path / "other") as other:
        impostor = other.save(2, make_payload(99))
    victim = directory / "model.ckpt-2.h5"
    storage = SwapBeforeOpen(directory, victim, impostor)
    ctx = ResolveContext(
        Family("model.ckpt", ".h5"),
        store_dir=directory,
        digest=True,
        quarantine=False,
        storage=storage,
        load=True,
    )
    found = resolve_restart(Hooks(plugin_manager()), "latest", ctx)
    assert found.step == 1 and found.fell_back
    state = Hooks(plugin_manager()).load_step(
        "hdf5", found.path, found.payload.reader()
    )
    assert_same(state, make_payload(1))


def test_another_rank_checks_what_it_reads_at_the_chiefs_level(tmp_path):
    """``payload_of`` of a broadcast answer (no bytes): one reading, checked again."""
    directory = tmp_path / "models"
    fill_store(directory, [1, 2])
    ctx = ResolveContext(Family("model.ckpt", ".h5"), store_dir=directory, digest=True)
    found = resolve_restart(Hooks(plugin_manager()), "latest", ctx)
    assert found.payload is None and found.checked == "digest"
    storage = LocalStorage(directory)
    assert payload_of(found, storage).data == found.path.read_bytes()
    assert reading_counts(storage) == (1, 1)
    with open_manager(tmp_path / "other") as other:
        os.replace(other.save(2, make_payload(99)), found.path)
    with pytest.raises(
        CorruptCheckpointError, match=r"does not match|bytes but its commit record says"
    ):
        payload_of(found, storage)


@pytest.mark.parametrize("fmt", FORMATS)
def test_inspect_opens_and_reads_the_file_once(tmp_path, fmt):
    directory = tmp_path / "models"
    fill_store(directory, [3], fmt)
    path = committed_paths(directory, fmt)[3]
    storage = LocalStorage()
    found = inspect_file(path, digest=True, storage=storage)
    assert (found["record"], found["digest_checked"], found["loaded"]) == (
        "ok",
        True,
        True,
    )
    assert reading_counts(storage) == (1, 1)


# -- the deepmd-kit host: its loaders read the bytes the preflight verified ----------


@needs_torch
def test_deepmds_torch_load_of_a_served_path_reads_the_verified_bytes(tmp_path):
    import torch

    pytest.importorskip("deepmd")
    from dp_ckpt_plugin.deepmd.loading import MISSING, ServedPayloads

    first, other = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"w": torch.ones(2)}, first)
    torch.save({"w": torch.zeros(2)}, other)
    served = ServedPayloads([LocalStorage().read_payload(first)], keep=("w", "x"))
    real = torch.load
    with served:
        assert torch.load is not real
        os.replace(other, first)  # the file is replaced after it was read
        # as deepmd-kit's trainer calls it, and with a memory map asked for
        loaded = torch.load(str(first), map_location="cpu", weights_only=True)
        mapped = torch.load(first, weights_only=True, mmap=True)
        assert loaded["w"].tolist() == mapped["w"].tolist() == [1.0, 1.0]
        # the keys asked for are kept from the first load: no load of their own
        assert served.kept(first, "w").tolist() == [1.0, 1.0]
        assert served.kept(first, "x", "absent") is None
        assert served.kept(tmp_path / "c.pt", "w", MISSING) is MISSING
        # a path that is not held goes to torch as it is
        torch.save({"x": 1}, tmp_path / "c.pt")
        assert torch.load(tmp_path / "c.pt", weights_only=True) == {"x": 1}
    assert torch.load is real
    assert served.served[str(first)] == 2
    assert served.get(first) is None  # given up when serving stopped


@needs_torch
def test_a_restart_preflight_reads_the_checkpoint_once_and_serves_it(
    tmp_path, monkeypatch
):
    import json

    import torch

    pytest.importorskip("deepmd")
    from dp_ckpt_plugin.deepmd.prepare import prepare_run
    from dp_ckpt_plugin.ranks import SingleProcess

    monkeypatch.chdir(tmp_path)
    fill_store(tmp_path / "models", [5, 10], "torch")
    config = {
        "training": {
            "save_dir": "models",
            "numb_steps": 10,
            "_dp_ckpt": {"verify": "digest", "stop_signals": []},
        }
    }
    (tmp_path / "input.json").write_text(json.dumps(config))
    prepared = prepare_run(
        str(tmp_path / "input.json"),
        restart="latest",
        init_model=None,
        pm=plugin_manager(),
        ranks=SingleProcess(),
        host="pt_expt",
    )
    try:
        counts = prepared.store.storage.counts
        assert (counts["payload_open"], counts["payload_read"]) == (1, 1)
        restart = prepared.restart
        assert restart == str(tmp_path / "models" / "model.ckpt-10.pt")
        with prepared.payloads:
            state = torch.load(restart, map_location="cpu", weights_only=True)
        assert prepared.payloads.served[restart] == 1
        assert_same(state, make_payload(10, "torch"))
        assert (counts["payload_open"], counts["payload_read"]) == (1, 1)
    finally:
        prepared.close()
