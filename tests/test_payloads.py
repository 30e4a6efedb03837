"""What a user's own tools see in a checkpoint, for every writer and format.

Generated over every pair the store offers: the thread and the process
writer, the torch and the HDF5 format, a synchronous and a background save.
For each, what is saved restores exactly; a torch checkpoint is a valid zip
archive to Python's ``zipfile`` (``testzip``, which checks every member's
CRC-32) and to ``unzip -t`` where that program is installed, and is byte for
byte the file a plain ``torch.save`` of the same state to a path of the
same name writes, with torch's defaults. A user's ``torch.save`` in the main
thread while background saves run keeps torch's CRC-32 too (the plugin
changes nothing of torch's configuration).
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import threading
import zipfile

import numpy as np
import pytest
from helpers import assert_same, make_payload, needs_torch

from dp_ckpt_plugin import CheckpointManager
from dp_ckpt_plugin.errors import ConfigError

WRITERS = ("thread", "process")
FORMATS = ("torch", "hdf5")
SAVES = ("sync", "background")
UNZIP = shutil.which("unzip")
#: The members of a torch archive that follow the pickle of the structure.
_PICKLED = ("/data.pkl", "/.data/serialization_id")


def _case(writer: str, format: str, save: str):
    marks = [needs_torch] if format == "torch" or writer == "process" else []
    return pytest.param(
        writer, format, save, id=f"{writer}-{format}-{save}", marks=marks
    )


PAIRS = [_case(*pair) for pair in itertools.product(WRITERS, FORMATS, SAVES)]


def state_of(format: str, step: int):
    """A payload of ``format``: tensors (with NumPy beside) or NumPy arrays."""
    if format == "hdf5":
        payload = make_payload(step)
        payload["nested"] = {"big": np.arange(50_000, dtype=np.float32) * step}
        return payload
    import torch

    gen = torch.Generator().manual_seed(step)
    return {
        "model": {
            "w": torch.nn.Parameter(torch.randn(300, 200, generator=gen)),
            "b": torch.randn(200, generator=gen, dtype=torch.float64),
            "ids": torch.arange(9, dtype=torch.int64) * step,
        },
        "optimizer": {"param_groups": [{"lr": 0.5 / step, "params": [0, 1]}]},
        "numpy": np.arange(6.0) * step,
        "step": step,
    }


def assert_valid_zip(path) -> None:
    """``zipfile`` and (when installed) ``unzip -t`` accept every member's CRC."""
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None, f"{path}: a member fails its CRC-32"
        names = archive.namelist()
    stem = path.name.rsplit(".", 1)[0]
    assert names and all(n.startswith(f"{stem}/") for n in names), names
    if UNZIP is not None:
        done = subprocess.run([UNZIP, "-t", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def assert_as_torch_saves(path, state, tmp_path, *, rebuilt: bool) -> None:
    """``path`` is what ``torch.save(state, <a path of the same name>)`` writes.

    Byte for byte, unless the state was ``rebuilt`` in another interpreter
    (the writer process): then the same members in the same order, the
    tensors' records byte for byte, and the pickle of the structure may
    differ only in how it refers to repeated strings (pickle's memo follows
    object identity, which a rebuilt state does not keep), and with it the
    archive's serialization id (torch derives it from the records' CRCs).
    """
    import torch

    plain = tmp_path / "plain" / path.name
    plain.parent.mkdir(exist_ok=True)
    torch.save(state, plain)
    with zipfile.ZipFile(path) as ours, zipfile.ZipFile(plain) as theirs:
        names = [i.filename for i in ours.infolist()]
        assert names == [i.filename for i in theirs.infolist()]
        for name in names:
            if not (rebuilt and name.endswith(_PICKLED)):
                assert ours.read(name) == theirs.read(name), name
    if not rebuilt:
        assert path.read_bytes() == plain.read_bytes()


@pytest.mark.parametrize(("writer", "format", "save"), PAIRS)
def test_every_writer_with_every_format_restores_exactly(
    writer, format, save, tmp_path
):
    """Each pair writes payloads that restore exactly; torch's are torch.save's."""
    directory = tmp_path / "models"
    states = {step: state_of(format, step) for step in (1, 2, 3)}
    with CheckpointManager(
        directory,
        format=format,
        writer=writer,
        async_save=save == "background",
        max_keep=0,
    ) as manager:
        remote = manager.store._background.process is not None
        assert remote == (writer == "process")
        paths = {step: manager.save(step, state) for step, state in states.items()}
        manager.wait()
        for step, state in states.items():
            restored = manager.restore(str(paths[step]))
            assert restored.step == step
            assert_same(restored.state, state)
    assert sorted(p.name for p in directory.iterdir() if p.is_dir()) == []
    if format == "torch":
        for step, path in paths.items():
            assert_valid_zip(path)
            rebuilt = writer == "process" and save == "background"
            assert_as_torch_saves(path, states[step], tmp_path, rebuilt=rebuilt)


@needs_torch
def test_a_users_torch_save_meanwhile_keeps_its_crc(tmp_path):
    """Background saves change nothing of torch's configuration for other threads."""
    import torch
    from torch.utils.serialization import config

    assert config.save.compute_crc32 is True
    seen = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(config.save.compute_crc32)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with CheckpointManager(
            tmp_path / "models", format="torch", async_save=True
        ) as manager:
            for step in range(1, 6):
                manager.save(step, state_of("torch", step))
                mine = tmp_path / f"mine-{step}.pt"
                torch.save({"x": torch.arange(1000.0) * step}, mine)
                assert_valid_zip(mine)
    finally:
        stop.set()
        watcher.join()
    assert seen and all(seen), "torch's CRC-32 was turned off meanwhile"


def test_a_pair_the_process_cannot_write_is_refused_in_one_line(tmp_path):
    """A store the writer process cannot serve is refused naming what stands in the way."""
    from dp_ckpt_plugin.storage.local import LocalStorage

    class Recording(LocalStorage):
        pass

    with pytest.raises(ConfigError) as caught:
        CheckpointManager(
            tmp_path / "m",
            format="hdf5",
            writer="process",
            storage=Recording(tmp_path / "m"),
        )
    message = str(caught.value)
    assert "\n" not in message
    assert "writer='process'" in message and "the storage Recording" in message


@needs_torch
def test_a_leftover_linking_directory_is_swept(tmp_path):
    """What a writer killed mid-write leaves (its file, linked by name) goes at open."""
    from dp_ckpt_plugin.storage.temp import temp_name

    directory = tmp_path / "models"
    with CheckpointManager(directory, format="torch") as manager:
        manager.save(1, state_of("torch", 1))
    tmp = directory / temp_name("model.ckpt-2.pt")
    tmp.write_bytes(b"torn")
    folder = directory / temp_name("model.ckpt-2.pt")
    folder.mkdir()
    (folder / "model.ckpt-2.pt").hardlink_to(tmp)
    kept = directory / ".user-folder"
    kept.mkdir()
    planted = directory / temp_name("model.ckpt-3.pt")
    planted.mkdir()
    (planted / "notes.txt").write_text("a user's")
    with CheckpointManager(directory, format="torch") as manager:
        manager.save(2, state_of("torch", 2))
    names = sorted(p.name for p in directory.iterdir())
    assert tmp.name not in names and folder.name not in names
    assert kept.is_dir()
    assert (planted / "notes.txt").read_text() == "a user's"  # not the store's link
    assert_valid_zip(directory / "model.ckpt-2.pt")
