"""Rule 45: a checkpoint without a commit record is checked by its own checksums.

A torch zip archive by the CRC32 of every member, an HDF5 file by reading
every dataset (fletcher32 where it has one); a legacy torch pickle carries
none and is said so. Checked on the bytes the storage read, through the
front door (``admit``) as every caller resolves a restart.
"""

from __future__ import annotations

import io
import logging
import os
import re

import pytest
from helpers import flipped, needs_torch, plugin_manager, zip_member_spans

from dp_ckpt_plugin import CorruptCheckpointError
from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.formats.checksums import Carried, check_carried
from dp_ckpt_plugin.plugin.hooks import Hooks
from dp_ckpt_plugin.resolution import ResolveContext, resolve_restart
from dp_ckpt_plugin.storage import default_storage


def torch_archive() -> bytes:
    """A real ``torch.save`` archive of a small deepmd-kit-like payload."""
    import torch

    buffer = io.BytesIO()
    state = {
        "model": {"w": torch.arange(64.0), "b": torch.ones(3, dtype=torch.float64)},
        "optimizer": {"state": {0: {"step": torch.tensor(5.0)}}, "lr": 0.01},
    }
    torch.save(state, buffer)
    return buffer.getvalue()


def read(tmp_path, data: bytes, name: str = "model.ckpt-5.pt"):
    path = tmp_path / name
    path.write_bytes(data)
    return default_storage().read_payload(path)


def ctx(tmp_path, suffix=".pt", **kwargs):
    return ResolveContext(Family("model.ckpt", suffix), cwd=tmp_path, **kwargs)


def resolve(spec: str, context: ResolveContext):
    """The front door, as every caller resolves a restart."""
    return resolve_restart(Hooks(plugin_manager()), spec, context)


@needs_torch
def test_an_intact_archive_passes_by_the_crc32_of_every_member(tmp_path):
    data = torch_archive()
    carried = check_carried(read(tmp_path, data))
    members = len(zip_member_spans(data))
    assert carried == Carried("zip", members, members) and carried.verified
    assert carried.describe() == (
        f"the CRC32 of all {members} members of its zip archive match"
    )


@needs_torch
def test_every_member_damaged_is_named(tmp_path):
    data = torch_archive()
    spans = [s for s in zip_member_spans(data) if s[2] > 0]
    assert len(spans) >= 5  # data.pkl, byteorder, the tensors, version, id
    for name, start, size in spans:
        damaged = flipped(data, start + size // 2)
        with pytest.raises(CorruptCheckpointError) as caught:
            check_carried(read(tmp_path, damaged))
        message = str(caught.value)
        assert "\n" not in message
        assert f"member {name} of its zip archive fails its check" in message, name
        assert "model.ckpt-5.pt is damaged" in message


@needs_torch
@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_archive_is_damaged(tmp_path, keep):
    data = torch_archive()
    with pytest.raises(CorruptCheckpointError, match="not a whole zip archive"):
        check_carried(read(tmp_path, data[: int(len(data) * keep)]))


def test_an_empty_file_is_damaged(tmp_path):
    with pytest.raises(CorruptCheckpointError, match="is damaged: empty"):
        check_carried(read(tmp_path, b""))


@needs_torch
def test_a_legacy_pickle_carries_no_checksum(tmp_path):
    import torch

    buffer = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buffer, _use_new_zipfile_serialization=False)
    carried = check_carried(read(tmp_path, buffer.getvalue()))
    assert carried.kind == "pickle" and not carried.verified
    assert "legacy torch pickle carries no checksum" in carried.describe()


def _hdf5_file(fletcher32: bool) -> tuple[bytes, int]:
    """An HDF5 file of two datasets; the offset of dataset ``a``'s data."""
    h5py = pytest.importorskip("h5py")
    import numpy as np

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as handle:
        handle.create_dataset(
            "group/a", data=np.arange(256.0), fletcher32=fletcher32, chunks=(256,)
        )
        handle.create_dataset("b", data=np.arange(4))
    data = buffer.getvalue()
    with h5py.File(io.BytesIO(data), "r") as handle:
        offset = handle["group/a"].id.get_chunk_info(0).byte_offset
    return data, offset


def test_an_hdf5_file_is_read_back_and_its_fletcher32_compared(tmp_path):
    data, offset = _hdf5_file(fletcher32=True)
    carried = check_carried(read(tmp_path, data, "model.ckpt-5.h5"))
    assert carried == Carried("hdf5", 2, 1)
    with pytest.raises(CorruptCheckpointError, match="dataset group/a fails its check"):
        check_carried(read(tmp_path, flipped(data, offset + 100), "model.ckpt-5.h5"))
    with pytest.raises(CorruptCheckpointError, match="HDF5 cannot open it"):
        check_carried(read(tmp_path, data[:100], "model.ckpt-5.h5"))


# -- through the front door ---------------------------------------------------------


@needs_torch
def test_the_front_door_checks_a_file_without_record_by_its_checksums(tmp_path):
    data = torch_archive()
    elsewhere = tmp_path / "trained" / "model.ckpt-5.pt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(data)
    linked = tmp_path / "next" / "model.ckpt-5.pt"
    linked.parent.mkdir()
    os.link(elsewhere, linked)  # as dflow hands a model to the next iteration
    found = resolve(str(linked), ctx(tmp_path, load=True))
    assert found.checked == "checksums" and found.warnings == []
    assert found.carried == Carried("zip", found.carried.parts, found.carried.parts)
    assert found.payload is not None and found.payload.data == data
    # damaged: one line naming the member, whatever asked
    name, start, size = zip_member_spans(data)[-2]
    linked.unlink()
    linked.write_bytes(flipped(data, start + size // 2))
    for load in (True, False):
        with pytest.raises(
            CorruptCheckpointError,
            match=re.escape(f"member {name} of its zip archive fails its check"),
        ):
            resolve(str(linked), ctx(tmp_path, load=load))


@needs_torch
def test_a_legacy_pickle_through_the_front_door_is_said_not_warned(tmp_path):
    import torch

    path = tmp_path / "model.ckpt-5.pt"
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    found = resolve(str(path), ctx(tmp_path))
    assert found.checked == "unverified" and found.carried.kind == "pickle"
    assert found.warnings == []


def test_a_file_of_no_known_format_is_warned_about(tmp_path, caplog):
    path = tmp_path / "model.ckpt-5.pt"
    path.write_bytes(b"from somewhere")
    with caplog.at_level(logging.WARNING):
        found = resolve(str(path), ctx(tmp_path))
    assert found.checked == "unverified" and found.carried.kind == "unknown"
    assert any("could not be verified" in w for w in found.warnings)
