"""Requests and bytes of ``latest`` and of a steady save, by how much a remote store keeps.

Counted, not timed, on the tests' memory storage (``memory://``, from
``tests/doubles/memory.py``), through
:class:`~dp_ckpt_plugin.CheckpointManager` (so the store is built by
:func:`dp_ckpt_plugin.remote.factory.open_remote`, as for any ``save_dir``
URL). A keep-all store is given 10, 2,000 and 100,000 checkpoints: one run
saves the newest, then its HEAD is grown to that many entries with the
catalogue module's own functions, as its writer would have (full segments
of ``SPILL`` entries named by segments of the next level, the rest in HEAD;
objects only for what is read). A second run then opens the store (lease,
fence, recovery: once per run, not counted), resolves ``latest`` and saves
one more step; each request of both is recorded with its bytes. Run::

    .venv/bin/python benchmarks/bench_remote_counts.py

:func:`section_counts` is the counted part of ``benchmarks/run.py``'s
``remote`` section.
"""

from __future__ import annotations

import secrets
import sys
import tempfile
from pathlib import Path

PREFIX = "model.ckpt"
COUNTS = (10, 2_000, 100_000)


def _kind(key: str) -> str:
    """What an object is, for the table: HEAD, LEASE, a record, a segment, a payload."""
    if key in ("HEAD", "LEASE"):
        return key
    if key.endswith(".commit.json"):
        return "record"
    if key.startswith("catalogue/"):
        return "segment"
    return "payload"


class Recorder:
    """Records each call of an object storage's primitives: kind, object, bytes."""

    def __init__(self, storage) -> None:
        self.storage = storage
        self.calls: list[tuple[str, str, int]] | None = None
        for name in ("put", "put_if_absent", "put_if_match"):
            self._wrap(name, lambda result, *a: result.size)
        self._wrap("get", lambda result, *a: len(result[0]) if result else 0)
        self._wrap("get_range", lambda result, *a: len(result))
        self._wrap("download", lambda result, *a: result.size)
        for name in ("head", "list", "folders", "delete"):
            self._wrap(name, lambda result, *a: 0)

    def _wrap(self, name: str, size) -> None:
        call = getattr(self.storage, name)

        def recorded(key, *args, **kwargs):
            result = call(key, *args, **kwargs)
            if name == "list":
                result = list(result)
            if self.calls is not None:
                self.calls.append((name, _kind(key), size(result)))
            return result

        setattr(self.storage, name, recorded)

    def start(self) -> None:
        self.calls = []

    def stop(self) -> list[tuple[str, str, int]]:
        calls, self.calls = self.calls or [], None
        return calls


def _tests_on_path() -> None:
    """Put the tests' support code (``head_support``, ``doubles``) on ``sys.path``."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def _grow(storage, count: int, digest: str) -> None:
    """Make HEAD keep steps 1..count-1 besides its newest, as the writer would."""
    from dp_ckpt_plugin.remote import head as heads

    _tests_on_path()
    from head_support import grow

    def entry(step: int) -> heads.Entry:
        name = f"{PREFIX}-{step}.pt"
        return heads.Entry(f"e000001/{name}", name, step, 1, digest)

    grow(storage, PREFIX, count, entry)


def measure(work: Path, count: int, state) -> dict[str, list[tuple[str, str, int]]]:
    """The calls of ``latest`` and of the next save, with ``count`` kept."""
    from dp_ckpt_plugin import CheckpointManager
    from dp_ckpt_plugin.remote import head as heads

    _tests_on_path()
    from doubles.memory import forget, serve_memory

    serve_memory()

    bucket = f"bench{count}{secrets.token_hex(3)}"
    url = f"memory://{bucket}/run"
    try:
        with CheckpointManager(
            url, format="torch", max_keep=0, staging=work / f"w{count}"
        ) as writer:
            writer.save(count, state)
            writer.flush(60)
            storage = writer.store.remote.storage
            digest = heads.read(storage)[0].family(PREFIX).kept[0].digest
        _grow(storage, count, digest)
        with CheckpointManager(
            url, format="torch", max_keep=0, staging=work / f"r{count}"
        ) as reader:
            reader.store.open()  # lease, fence of HEAD: once per run
            remote = reader.store.remote
            assert remote.recovered.wait(60)  # its listing, on its own thread
            recorder = Recorder(remote.storage)
            recorder.start()
            found = reader.store.resolve("latest")
            latest = recorder.stop()
            assert found.step == count, found
            recorder.start()
            reader.save(count + 1, state)
            reader.flush(60)
            save = recorder.stop()
        return {"latest": latest, "save": save}
    finally:
        forget(bucket)


def summary(calls: list[tuple[str, str, int]]) -> str:
    """``3 requests (get HEAD 1,234 B, ...)``: each request, in order."""
    parts = [f"{op} {kind} {size:,} B" for op, kind, size in calls]
    return f"{len(calls)} requests ({', '.join(parts)})"


def swap_bytes(calls: list[tuple[str, str, int]]) -> int:
    """The bytes of a save's swap of HEAD (its ``put_if_match``)."""
    return sum(s for op, kind, s in calls if op == "put_if_match" and kind == "HEAD")


def section_counts(work: Path, state, counts=COUNTS) -> dict[int, dict]:
    """Print the figures of each count; return them."""
    figures = {}
    print("\n[remote] requests and bytes by checkpoints kept (memory://, counted)")
    for count in counts:
        got = measure(work, count, state)
        figures[count] = got
        print(f"  {count:,} kept")
        print(f"    latest: {summary(got['latest'])}")
        print(f"    steady save: {summary(got['save'])}")
    return figures


def main() -> int:
    import torch

    state = {
        "model": {"w": torch.randn(1 << 18, generator=torch.Generator().manual_seed(1))}
    }
    with tempfile.TemporaryDirectory(prefix=".bench-counts-") as tmp:
        section_counts(Path(tmp), state)  # 1 MiB, as benchmarks/run.py gives it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
