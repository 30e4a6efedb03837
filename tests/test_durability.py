"""Which fsync protects what: the order of durable steps of a save, observed.

The crash-state explorer (``test_crash_states.py``) proves the states a crash
can leave are safe; these tests pin down the ordering it relies on, step by
step, by recording the file operations of real saves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import BACKENDS, is_temp, make_payload, open_manager, plugin_manager

from dp_ckpt_plugin import CheckpointManager, CheckpointWriteError, FormatInfo, hookimpl
from dp_ckpt_plugin.checkpoint.layout import record_name


class Recorder:
    """Log ``os`` calls that change or flush a directory, relative to ``root``."""

    def __init__(self, monkeypatch, root: Path) -> None:
        self.root = root
        self.ops: list[tuple[str, ...]] = []
        for name in ("replace", "unlink", "mkdir", "symlink"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(name, real))
        real_fsync = os.fsync

        def fsync(fd):
            target = os.readlink(f"/proc/self/fd/{fd}")
            self.ops.append(("fsync", self.rel(target)))
            return real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def rel(self, path) -> str:
        path = os.fspath(path)
        return os.path.relpath(path, self.root) if os.path.isabs(path) else path

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            paths = [self.rel(a) for a in args if isinstance(a, (str, os.PathLike))]
            if name == "symlink":
                paths = paths[1:]  # the link, not its target
            self.ops.append((name, *paths))
            return real(*args, **kwargs)

        return call

    def index(self, op: tuple[str, ...]) -> int:
        return self.ops.index(op)


def strip_temp(ops):
    """Replace temporary names by ``<tmp:final>`` so sequences are comparable."""
    out = []
    for op in ops:
        parts = [op[0]]
        for p in op[1:]:
            head, name = os.path.split(p)
            if is_temp(name):
                name = f"<tmp:{name[1 : name.rindex('.tmp-')]}>"
            parts.append(os.path.join(head, name) if head else name)
        out.append(tuple(parts))
    return out


def test_first_save_into_a_new_directory_is_durable_in_its_parents(
    tmp_path, monkeypatch
):
    rec = Recorder(monkeypatch, tmp_path)
    with open_manager(tmp_path / "run" / "models", max_keep=0) as m:
        m.save(1, make_payload(1))
    ops = strip_temp(rec.ops)
    # each new directory is created, then its parent is fsynced
    assert ops.index(("mkdir", "run")) < ops.index(("fsync", "."))
    assert ops.index(("mkdir", "run/models")) < ops.index(("fsync", "run"))


def test_a_save_makes_each_step_durable_before_the_next(tmp_path, monkeypatch):
    d = tmp_path / "models"
    with open_manager(d, max_keep=0) as m:
        m.save(1, make_payload(1))
        rec = Recorder(monkeypatch, d)
        m.save(2, make_payload(2))
    ops = strip_temp(rec.ops)
    payload, record = "model.ckpt-2.h5", record_name("model.ckpt-2.h5")
    i_payload_fsync = ops.index(("fsync", f"<tmp:{payload}>"))
    i_record_move = ops.index(("replace", f"<tmp:{record}>", record))
    i_payload_move = ops.index(("replace", f"<tmp:{payload}>", payload))
    i_pointer_move = ops.index(("replace", "<tmp:checkpoint>", "checkpoint"))
    i_alias_move = ops.index(("replace", "<tmp:model.ckpt.h5>", "model.ckpt.h5"))
    i_record_fsync = ops.index(("fsync", record))
    # the payload's bytes are durable before anything names them; the record
    # is moved onto its name unsynced, then its bytes and its name are made
    # durable (its data and the directory fsynced, at once, while the
    # payload's fsync runs) before the payload gets its name; the payload's
    # name, the pointer and the alias are made durable by one fsync of the
    # directory after the three moves, before the save returns
    assert max(i_payload_fsync, i_record_move) < i_payload_move < i_pointer_move
    assert i_record_move < i_record_fsync < i_payload_move
    assert ("fsync", ".") in ops[i_record_move:i_payload_move]
    assert ("fsync", ".") not in ops[i_payload_move:i_pointer_move]
    assert ("fsync", ".") in ops[max(i_pointer_move, i_alias_move) :]


def test_pruning_makes_the_payloads_removal_durable_before_the_records(
    tmp_path, monkeypatch
):
    d = tmp_path / "models"
    with open_manager(d, max_keep=1) as m:
        m.save(1, make_payload(1))
        rec = Recorder(monkeypatch, d)
        m.save(2, make_payload(2))
        # the prune makes no fsync: its record waits for the next one
        assert (d / record_name("model.ckpt-1.h5")).is_file()
        assert ops_after(rec, ("unlink", "model.ckpt-1.h5")) == []
        m.save(3, make_payload(3))
        ops = strip_temp(rec.ops)
        i_payload = ops.index(("unlink", "model.ckpt-1.h5"))
        i_record = ops.index(("unlink", record_name("model.ckpt-1.h5")))
        assert i_payload < i_record
        assert ("fsync", ".") in ops[i_payload:i_record]
        # closing removes the last prune's record after an fsync
        assert (d / record_name("model.ckpt-2.h5")).is_file()
    ops = strip_temp(rec.ops)
    i_payload = ops.index(("unlink", "model.ckpt-2.h5"))
    i_record = ops.index(("unlink", record_name("model.ckpt-2.h5")))
    assert ("fsync", ".") in ops[i_payload:i_record]
    assert not (d / record_name("model.ckpt-2.h5")).exists()


def ops_after(rec, op):
    """The fsyncs recorded after ``op``."""
    ops = strip_temp(rec.ops)
    return [o for o in ops[ops.index(op) :] if o[0] == "fsync"]


def test_a_resave_keeps_a_committed_checkpoint_at_every_step(tmp_path, monkeypatch):
    """After every operation of a re-save the step verifies (old or new payload)."""
    from dp_ckpt_plugin.checkpoint.catalogue import read_record_or_none
    from dp_ckpt_plugin.checkpoint.records import verify

    d = tmp_path / "models"
    seen = []
    with open_manager(d, max_keep=0) as m:
        m.save(1, make_payload(1))
        m.save(2, make_payload(2))
        path = d / "model.ckpt-2.h5"
        real_replace = os.replace

        def replace(src, dst):
            real_replace(src, dst)
            record = read_record_or_none(path)
            assert record is not None, f"no valid record after replace {dst}"
            verify(path, record, digest=True)
            seen.append(os.path.basename(os.fspath(dst)))

        monkeypatch.setattr(os, "replace", replace)
        m.save(2, make_payload(20, sizes=(100, 100, 100)))
    record = record_name(path.name)
    assert seen == [record, path.name, record, "checkpoint", "model.ckpt.h5"]


class Exploding:
    """A format whose writer fails the way torch.save does on a full disk."""

    @hookimpl
    def register_formats(self):
        return [FormatInfo("boom", ".boom")]

    @hookimpl
    def on_save_step(self, format, file):
        if format != "boom":
            return None
        file.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos")


@pytest.mark.parametrize("first", [True, False])
def test_a_format_error_is_a_write_error_naming_path_and_cause(tmp_path, first):
    m = CheckpointManager(tmp_path / "m", format="boom", pm=plugin_manager(Exploding()))
    with pytest.raises(CheckpointWriteError) as info:
        m.save(3, {"a": 1})
    message = str(info.value)
    assert str(tmp_path / "m" / "model.ckpt-3.boom") in message
    assert "RuntimeError" in message and "unexpected pos" in message
    assert [n for n in os.listdir(tmp_path / "m") if is_temp(n)] == []
    m.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_steady_save_makes_four_fsyncs_and_reads_no_checkpoint(tmp_path, backend):
    """Issue 18: payload, record, the directory twice; no payload is read back."""
    from dp_ckpt_plugin.storage.local import LocalStorage

    storage = LocalStorage(tmp_path / "m")
    with CheckpointManager(
        tmp_path / "m", format=backend, max_keep=2, storage=storage
    ) as m:
        for step in (1, 2, 3):
            m.save(step, make_payload(step, backend))
        storage.counts.clear()
        m.save(4, make_payload(4, backend))
        assert storage.counts["fsync"] == 2  # the payload's data, the record's
        assert storage.counts["fsync_dir"] == 2  # after the record, after publishing
        assert storage.counts["payload_open"] == 0
        assert storage.counts["small_bytes"] <= 64  # the pointer's line
        assert [c.step for c in m.store.committed()] == [3, 4]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd")
@pytest.mark.parametrize("meanwhile", [False, True], ids=["plain", "with-a-record"])
def test_the_naming_folder_goes_beside_the_flush_and_before_the_write_returns(
    tmp_path, meanwhile
):
    """The folder naming a payload by its final name is removed off the caller's thread.

    ``torch.save`` still names its archive's folder after the final name,
    and nothing of the folder is left when ``write_payload`` returns.
    """
    import threading
    import zipfile

    torch = pytest.importorskip("torch")
    from dp_ckpt_plugin.storage.local import LocalStorage

    removers: list[str] = []

    class Watching(LocalStorage):
        def _sys_rmdir(self, path):
            removers.append(threading.current_thread().name)
            return super()._sys_rmdir(path)

    storage = Watching(tmp_path)
    tmp, digest = storage.write_payload(
        tmp_path / "model.ckpt-1.pt",
        lambda handle: torch.save({"x": torch.ones(3)}, handle.os_path),
        durable=True,
        digest=lambda view: f"n{len(view)}",
        meanwhile=(lambda tmp, digest: None) if meanwhile else None,
    )
    caller = threading.current_thread().name
    assert removers == [f"{caller}/dp_ckpt-tidy"]
    assert [p.name for p in tmp_path.iterdir()] == [tmp.name]
    assert digest == f"n{tmp.stat().st_size}"
    with zipfile.ZipFile(tmp) as archive:
        assert {n.split("/")[0] for n in archive.namelist()} == {"model.ckpt-1"}
