"""``LocalStorage.map_payload``: a checkpoint file's bytes mapped, opened as any payload is.

The uploader hashes and sends a staged checkpoint from this map (no read
call, no copy in this process); it must open only a regular file, as
``open_payload`` does, and leave nothing mapped once its block ends.
"""

from __future__ import annotations

import os

import pytest

from dp_ckpt_plugin import UnreadableFileError
from dp_ckpt_plugin.storage.local import LocalStorage


def test_a_regular_file_is_mapped_whole_and_released(tmp_path):
    path = tmp_path / "model.ckpt-1.pt"
    data = os.urandom(3 << 20) + b"end"
    path.write_bytes(data)
    storage = LocalStorage()
    with storage.map_payload(path) as view:
        assert view.readonly and view.nbytes == len(data) and view == data
        kept = view
    with pytest.raises(ValueError):
        kept.tobytes()  # released with its block
    assert storage.counts["payload_map"] == 1


def test_an_empty_file_is_an_empty_view(tmp_path):
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    with LocalStorage().map_payload(path) as view:
        assert view.nbytes == 0


def test_a_slice_held_past_the_block_does_not_fail_the_block(tmp_path):
    path = tmp_path / "model.ckpt-2.pt"
    path.write_bytes(b"x" * 8192)
    held = []
    with LocalStorage().map_payload(path) as view:
        held.append(memoryview(view.obj)[:10])  # a second export of the map
    assert bytes(held[0]) == b"x" * 10


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "dangling link"])
def test_only_a_regular_file_is_mapped(tmp_path, kind):
    path = tmp_path / "model.ckpt-3.pt"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    expected = (
        FileNotFoundError
        if kind in ("missing", "dangling link")
        else (UnreadableFileError)
    )
    with pytest.raises(expected), LocalStorage().map_payload(path):
        pass
