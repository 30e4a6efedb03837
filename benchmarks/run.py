"""Every performance target of dp_ckpt_plugin, measured the way users save.

Saves go through the public :class:`~dp_ckpt_plugin.CheckpointManager` and
through the store the ``dp`` host builds (its families and working-directory
mirrors), against baselines with nothing extra in the timed region:
``torch.save`` to a path plus an fsync of the file, a raw write of the same
bytes plus an fsync, and a bare ``copy_`` of the tensors into reused buffers.
Files are removed outside the timed region. Each section interleaves its
variants round by round (A, B, C, A, B, C, ...), so that a disturbance of the
machine hits them alike, and prints the min and the median of the rounds;
ratios are of medians. Counted figures (bytes read and fsync-class calls of
one steady save, from ``strace -f``) do not depend on noise. Run::

    .venv/bin/python benchmarks/run.py                 # everything
    .venv/bin/python benchmarks/run.py --quick         # 16 and 64 MiB, 7 rounds
    .venv/bin/python benchmarks/run.py --only save     # one section

Sections: ``save`` (synchronous durable saves), ``async`` (background saves:
the loop's stall, stall plus persist), ``crc`` (what skipping torch's zip
CRC32 would save; the plugin keeps it), ``strace`` (bytes read, fsync calls),
``count`` (save and ``latest`` with 2,000 kept against 10), ``digest`` (the
digest read back from the page cache against hashing while writing), ``dp``
(``dp --pt-expt train`` and ``dp --pt train``, a checkpoint every step),
``import`` (the entry
point), ``remote`` (a ``save_dir`` on moto's S3 server: upload throughput, the
save's stall, remote calls of a save and of ``latest``). Every target is printed with its figure and ``met`` or ``MISSED``.
``--baseline TREE`` runs another source tree's savers (``save``) and
background variants (``dp``) interleaved with this tree's.
Results are reported in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
THREADS = {
    "OMP_NUM_THREADS": "1",
    "DP_INTRA_OP_PARALLELISM_THREADS": "1",
    "DP_INTER_OP_PARALLELISM_THREADS": "1",
}
RESULTS: list[dict] = []
#: How many tensors a payload is split into (a model's parameters, roughly).
TENSORS = 16


def interleaved(variants: dict[str, Callable[[], float | None]], rounds: int) -> dict:
    """Run each variant once per round, in turn; return every round's seconds.

    A variant returns its own measured seconds, or ``None`` to be timed whole.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            measured = fn()
            elapsed = time.perf_counter() - start
            times[name].append(measured if measured is not None else elapsed)
    return times


def med(values: list[float]) -> float:
    return statistics.median(values)


def show(label: str, values: list[float]) -> None:
    print(
        f"    {label:44s} min {min(values) * 1e3:8.1f} ms   "
        f"median {med(values) * 1e3:8.1f} ms"
    )


def report(section: str, label: str, value: float, target: str, ok: bool) -> None:
    verdict = "met" if ok else "MISSED"
    print(f"  {label:60s} {value:9.3f}   target {target:8s} {verdict}")
    RESULTS.append(
        {
            "section": section,
            "figure": label,
            "value": value,
            "target": target,
            "met": ok,
        }
    )


# -- payloads and baselines -----------------------------------------------------------


def make_state(mib: int) -> dict:
    """``mib`` MiB of float32 in :data:`TENSORS` tensors, as a model state."""
    import torch

    n = mib * (1 << 20) // 4 // TENSORS
    gen = torch.Generator().manual_seed(mib)
    return {
        "model": {f"w{i}": torch.randn(n, generator=gen) for i in range(TENSORS)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
    }


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save_fsync(work: Path, state) -> Callable[[], float]:
    """``torch.save`` to a path, then fsync it: what a careful user writes."""
    import torch

    path = work / "baseline.pt"

    def run() -> float:
        start = time.perf_counter()
        torch.save(state, path)
        fsync_path(path)
        seconds = time.perf_counter() - start
        path.unlink()
        return seconds

    return run


def raw_write_fsync(work: Path, data: bytes) -> Callable[[], float]:
    """The serialized bytes written in one call, then fsynced."""
    path = work / "raw.bin"

    def run() -> float:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - start
        path.unlink()
        return seconds

    return run


def bare_copy(state) -> Callable[[], float]:
    """``copy_`` of every tensor into buffers allocated once."""
    tensors = list(state["model"].values())
    buffers = [t.clone() for t in tensors]

    def run() -> float:
        start = time.perf_counter()
        for buffer, tensor in zip(buffers, tensors, strict=True):
            buffer.copy_(tensor)
        return time.perf_counter() - start

    return run


def serialized(state) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


# -- the stores users save through ------------------------------------------------------


def writers() -> tuple[str, ...]:
    """The background writers this version of the plugin has."""
    import inspect

    from dp_ckpt_plugin import CheckpointManager

    has = "writer" in inspect.signature(CheckpointManager).parameters
    return ("thread", "process") if has else ("thread",)


#: The package the savers come from (``dp_ckpt_plugin``, or a baseline's copy).
PACKAGE = "dp_ckpt_plugin"
#: The name a baseline tree's package is imported under (:func:`load_baseline`).
BASELINE = "dp_ckpt_plugin_baseline"


def load_baseline(tree: Path) -> str:
    """Import the package of another source tree under :data:`BASELINE`.

    Its modules import one another relatively, so its store, commit and
    storage are its own; the formats it loads by name are this tree's.
    """
    import importlib.util

    root = tree / "dp_ckpt_plugin"
    spec = importlib.util.spec_from_file_location(
        BASELINE, root / "__init__.py", submodule_search_locations=[str(root)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[BASELINE] = module
    spec.loader.exec_module(module)
    return BASELINE


def manager_for(
    directory: Path,
    *,
    keep: int = 2,
    async_save: bool = False,
    writer: str = "",
    package: str = PACKAGE,
):
    import importlib

    CheckpointManager = importlib.import_module(package).CheckpointManager

    extra = {"writer": writer} if writer and len(writers()) > 1 else {}
    return CheckpointManager(
        directory, format="torch", max_keep=keep, async_save=async_save, **extra
    )


def dp_store_for(cwd: Path, *, keep: int = 2, package: str = PACKAGE):
    """The store ``dp --pt-expt train`` builds for ``save_dir: models``."""
    import dataclasses
    import importlib

    def of(name: str):
        return importlib.import_module(f"{package}{name}")

    get_plugin_manager = of("").get_plugin_manager
    build_store = of(".deepmd.prepare").build_store
    read_settings = of(".deepmd.settings").read_settings
    SingleProcess = of(".ranks").SingleProcess
    KeepLast = of(".retention").KeepLast

    cwd.mkdir(parents=True, exist_ok=True)
    config = {"training": {"save_dir": "models", "save_ckpt": "model.ckpt"}}
    settings = read_settings(config, suffix=".pt", cwd=cwd)
    settings.save_dir = cwd / "models"
    store = build_store(settings, get_plugin_manager(), SingleProcess(), "pt_expt")
    for config in list(store.families.values()):
        store.add_family(dataclasses.replace(config, policy=KeepLast(keep)))
    return store


class Saver:
    """Numbered saves through a manager or a store, timed whole."""

    def __init__(self, target) -> None:
        self.target = target
        self.step = 0

    def __call__(self, state) -> Callable[[], float]:
        def run() -> float:
            self.step += 1
            start = time.perf_counter()
            self.target.save(self.step, state)
            return time.perf_counter() - start

        return run


def with_cpu(fn: Callable[[], float], sink: list[float]) -> Callable[[], float]:
    """``fn``, also putting the process's CPU time of each call (every thread) in ``sink``.

    CPU time moves much less than wall time with the load of a shared machine;
    a save's work beyond the baseline's shows in it whatever the other cores do.
    """

    def run() -> float:
        used = time.process_time()
        seconds = fn()
        sink.append(time.process_time() - used)
        return seconds

    return run


# -- sections ---------------------------------------------------------------------------


def section_save(
    work: Path, sizes: list[int], rounds: int, baseline: str | None = None
) -> None:
    print("\n[save] durable synchronous save of a torch state (16 tensors)")
    for mib in sizes:
        state = make_state(mib)
        data = serialized(state)
        manager = manager_for(work / f"manager-{mib}")
        dp_store = dp_store_for(work / f"dp-{mib}")
        cpu: dict[str, list[float]] = {}
        variants = {
            "torch.save to a path + fsync": torch_save_fsync(work, state),
            "raw write + fsync of the same bytes": raw_write_fsync(work, data),
            "CheckpointManager.save": Saver(manager)(state),
            "the dp host's store": Saver(dp_store)(state),
        }
        others = []
        if baseline is not None:  # the same savers of another tree, interleaved
            others = [
                manager_for(work / f"manager-{mib}-baseline", package=baseline),
                dp_store_for(work / f"dp-{mib}-baseline", package=baseline),
            ]
            variants["CheckpointManager.save (baseline)"] = Saver(others[0])(state)
            variants["the dp host's store (baseline)"] = Saver(others[1])(state)
        times = interleaved(
            {k: with_cpu(fn, cpu.setdefault(k, [])) for k, fn in variants.items()},
            rounds,
        )
        manager.close()
        dp_store.close()
        for other in others:
            other.close()
        print(f"  {mib} MiB ({len(data) / (1 << 20):.1f} MiB serialized):")
        for label, values in times.items():
            show(label, values)
        for label in ("torch.save to a path + fsync", "CheckpointManager.save"):
            show(f"CPU time, {label}", cpu[label])
        extra = med(cpu["CheckpointManager.save"]) - med(
            cpu["torch.save to a path + fsync"]
        )
        print(f"  {'':60s} {extra * 1e3:9.1f}   (ms of CPU the manager adds, median)")
        base = med(times["torch.save to a path + fsync"])
        for label in ("CheckpointManager.save", "the dp host's store"):
            ratio = med(times[label]) / base
            report(
                "save",
                f"{mib} MiB {label} / (torch.save + fsync)",
                ratio,
                "<= 1.15",
                ratio <= 1.15,
            )
        for label in ("CheckpointManager.save", "the dp host's store"):
            if f"{label} (baseline)" in times:
                ratio = med(times[f"{label} (baseline)"]) / base
                text = f"{mib} MiB baseline: {label} / (torch.save + fsync)"
                print(f"  {text:60s} {ratio:9.3f}   (no target)")
        raw = med(times["raw write + fsync of the same bytes"])
        print(
            f"  {'':60s} {raw / med(times['CheckpointManager.save']):9.3f}"
            "   (raw write's time / manager's: the bandwidth fraction)"
        )


def section_async(work: Path, sizes: list[int], rounds: int) -> None:
    print("\n[async] background saves: the training loop's stall, then the persist")
    for mib in sizes:
        state = make_state(mib)
        variants = {
            "bare copy_ into reused buffers": bare_copy(state),
            "torch.save to a path + fsync": torch_save_fsync(work, state),
        }
        persisted: dict[str, list[float]] = {}
        managers = []
        for writer in ("thread", "process"):
            if writer not in writers():
                continue
            manager = manager_for(
                work / f"async-{mib}-{writer}", async_save=True, writer=writer
            )
            managers.append(manager)
            persisted[writer] = []
            variants[f"background save ({writer}): the stall"] = _background(
                manager, state, persisted[writer]
            )
        times = interleaved(variants, rounds)
        for manager in managers:
            manager.close()
        for writer, values in persisted.items():
            times[f"background save ({writer}): stall + persist"] = values
        print(f"  {mib} MiB:")
        for label, values in times.items():
            show(label, values)
        for writer in persisted:
            ratio = med(times[f"background save ({writer}): the stall"]) / med(
                times["bare copy_ into reused buffers"]
            )
            report(
                "async",
                f"{mib} MiB stall ({writer}) / bare copy_",
                ratio,
                "<= 1.25",
                ratio <= 1.25,
            )
            ratio = med(persisted[writer]) / med(times["torch.save to a path + fsync"])
            report(
                "async",
                f"{mib} MiB stall + persist ({writer}) / (torch.save + fsync)",
                ratio,
                "<= 1.3",
                ratio <= 1.3,
            )


def section_crc(work: Path, sizes: list[int], rounds: int) -> None:
    """What skipping torch's zip CRC32 would save (the plugin keeps it).

    torch has no per-call switch for it, only its process-wide configuration
    (``torch.serialization.set_crc32_options``), which this section sets
    around its own variant, in this thread, and puts back. Besides the wall
    time, the CPU time of the process (``time.process_time``, every thread)
    is printed: it moves much less with the load of a shared machine.
    """
    import torch

    print("\n[crc] torch.save + fsync with torch's CRC32 (its default) and without")
    path = work / "crc.pt"
    for mib in sizes:
        state = make_state(mib)
        cpu: dict[str, list[float]] = {"on": [], "off": []}

        def save(kind: str, state=state, cpu=cpu) -> float:
            torch.serialization.set_crc32_options(kind == "on")
            try:
                start, used = time.perf_counter(), time.process_time()
                torch.save(state, path)
                fsync_path(path)
                seconds = time.perf_counter() - start
                cpu[kind].append(time.process_time() - used)
            finally:
                torch.serialization.set_crc32_options(True)
            path.unlink()
            return seconds

        times = interleaved(
            {
                "with CRC32 (torch's default)": lambda: save("on"),
                "CRC32 off": lambda: save("off"),
            },
            rounds,
        )
        print(f"  {mib} MiB:")
        for label, values in times.items():
            show(label, values)
        show("CPU time, with CRC32", cpu["on"])
        show("CPU time, CRC32 off", cpu["off"])
        on, off = med(times["with CRC32 (torch's default)"]), med(times["CRC32 off"])
        print(
            f"  {mib} MiB CRC32 off / on: {off / on:.3f} "
            f"(saves {(on - off) * 1e3:.1f} ms of {on * 1e3:.1f} ms, median; "
            f"CPU {med(cpu['off']) / med(cpu['on']):.3f})"
        )


def _background(manager, state, persisted: list[float]) -> Callable[[], float]:
    step = [0]

    def run() -> float:
        step[0] += 1
        start = time.perf_counter()
        manager.save(step[0], state)
        stall = time.perf_counter() - start
        manager.wait()  # the next round starts idle
        persisted.append(time.perf_counter() - start)
        return stall

    return run


_SYNC = re.compile(r"\b(fsync|fdatasync|sync_file_range)\(")
_READ = re.compile(r"\b(read|pread64|readv|preadv|preadv2)\((\d+)(<([^>]*)>)?")
_RESUMED = re.compile(r"<\.\.\. (read|pread64|readv|preadv|preadv2) resumed>")
_RESULT = re.compile(r"= (\d+)(?: <[^>]*>)?$")
_PAYLOAD_MAP = re.compile(r"mmap\(NULL, (\d+), PROT_READ, MAP_SHARED, \d+<([^>]*)>")


def child_steady(kind: str, directory: Path, mib: int) -> None:
    """Save three times, then once between markers (run under strace)."""
    state = make_state(mib)
    target = manager_for(directory) if kind == "manager" else dp_store_for(directory)
    for step in (1, 2, 3):
        target.save(step, state)

    def mark(name: str) -> None:
        with contextlib.suppress(OSError):
            os.open(f"/nonexistent-dp-ckpt-{name}", os.O_RDONLY)

    mark("start")
    target.save(4, state)
    mark("end")
    target.close()


def section_strace(work: Path, mib: int) -> None:
    print(f"\n[strace] one steady save of {mib} MiB with retention (keep 2), counted")
    if shutil.which("strace") is None:
        print("  strace is not installed: skipped")
        return
    for kind, label in (
        ("manager", "CheckpointManager"),
        ("dp", "the dp host's store"),
    ):
        directory = work / f"strace-{kind}"
        log = work / f"strace-{kind}.txt"
        subprocess.run(
            [
                "strace",
                "-f",
                "-y",
                "-o",
                str(log),
                "-e",
                "signal=none",
                "-e",
                "trace=read,pread64,readv,preadv,preadv2,openat,mmap,"
                "fsync,fdatasync,sync_file_range",
                sys.executable,
                __file__,
                "--child-steady",
                kind,
                str(directory),
                str(mib),
            ],
            check=True,
            env={**os.environ, **THREADS},
        )
        read, by_file, syncs, mapped = count_strace(log)
        top = sorted(by_file.items(), key=lambda kv: -kv[1])[:3]
        print(f"  {label}: {syncs} fsync-class calls, {read} bytes read by read calls")
        for name, n in top:
            print(f"    {n:>12d} bytes from {name}")
        for name, n in mapped:
            print(
                f"    the new payload mapped read-only to be hashed: {n} bytes "
                f"({Path(name).name}, page cache, no read call)"
            )
        report(
            "strace",
            f"{label}: MiB read by one steady save",
            read / (1 << 20),
            "<= 1",
            read <= (1 << 20),
        )
        report(
            "strace",
            f"{label}: fsync-class calls of one steady save",
            syncs,
            "<= 4",
            syncs <= 4,
        )


def count_strace(log: Path) -> tuple[int, dict[str, int], int, list]:
    """Bytes read, bytes per file, fsync-class calls and maps between the markers."""
    on = False
    read = syncs = 0
    by_file: dict[str, int] = {}
    pending: dict[str, str] = {}
    mapped = []
    for line in log.read_text().splitlines():
        if "nonexistent-dp-ckpt-start" in line:
            on = True
            continue
        if "nonexistent-dp-ckpt-end" in line:
            break
        if not on:
            continue
        pid = line.split(" ", 1)[0]
        if _SYNC.search(line) and "resumed" not in line:
            syncs += 1
        if found := _PAYLOAD_MAP.search(line):
            mapped.append((found.group(2), int(found.group(1))))
        name = None
        if found := _READ.search(line):
            name = found.group(4) or "?"
            if "<unfinished" in line:
                pending[pid] = name
                continue
        elif _RESUMED.search(line):
            name = pending.pop(pid, "?")
        if name is not None and (result := _RESULT.search(line)):
            read += int(result.group(1))
            by_file[name] = by_file.get(name, 0) + int(result.group(1))
    return read, by_file, syncs, mapped


def section_count(work: Path, counts: list[int], rounds: int) -> None:
    import torch

    from dp_ckpt_plugin import CheckpointManager

    print("\n[count] save and resolve('latest') with many checkpoints kept (keep all)")
    tiny = {"w": torch.zeros(16)}
    managers = {}
    for n in counts:
        directory = work / f"count-{n}"
        with CheckpointManager(
            directory, format="torch", max_keep=0, durable=False
        ) as m:
            for step in range(1, n + 1):
                m.save(step, tiny)
        managers[n] = CheckpointManager(directory, format="torch", max_keep=0)
        managers[n].resolve("latest")  # the run continues: nothing is archived
        managers[n].save(n + 1, tiny)  # opens: lock, sweep, catalogue read once
    steps = {n: n + 1 for n in counts}

    def saver(n):
        def save():
            steps[n] += 1
            managers[n].save(steps[n], tiny)

        return save

    variants = {f"save, {n} kept": saver(n) for n in counts}
    variants.update(
        {
            f"latest, {n} kept": (lambda n=n: managers[n].resolve("latest"))
            for n in counts
        }
    )
    variants = {k: (lambda f=f: (f(), None)[1]) for k, f in variants.items()}
    times = interleaved(variants, rounds)
    for m in managers.values():
        m.close()
    for label, values in times.items():
        show(label, values)
    low, high = min(counts), max(counts)
    for what, target, limit in (("save", "<= 1.2", 1.2), ("latest", "<= 1.5", 1.5)):
        ratio = med(times[f"{what}, {high} kept"]) / med(times[f"{what}, {low} kept"])
        report(
            "count",
            f"{what} with {high} kept / with {low}",
            ratio,
            target,
            ratio <= limit,
        )


def section_digest(work: Path, mib: int, rounds: int) -> None:
    """Hashing while writing (through a file object) against reading back."""
    import hashlib  # noqa: F401  (sha256 is the old records' algorithm)
    import mmap
    import queue
    import threading

    import blake3
    import torch

    print(f"\n[digest] {mib} MiB: where the digest of the record is computed")
    state = make_state(mib)

    class HashingFile:
        """Writes go to the file and, in order, to a hashing thread."""

        def __init__(self, handle):
            self.handle = handle
            self.hash = blake3.blake3()
            self.queue: queue.Queue = queue.Queue(64)
            self.thread = threading.Thread(target=self.consume)
            self.thread.start()

        def consume(self):
            while (chunk := self.queue.get()) is not None:
                self.hash.update(chunk)

        def write(self, data):
            n = self.handle.write(data)
            self.queue.put(bytes(data) if len(data) < (1 << 20) else data)
            return n

        def flush(self):
            self.handle.flush()

        def finish(self):
            self.queue.put(None)
            self.thread.join()
            return self.hash.hexdigest()

    path = work / "digest.pt"

    def while_writing():
        start = time.perf_counter()
        with open(path, "wb") as handle:
            hashing = HashingFile(handle)
            torch.save(state, hashing)
            hashing.finish()
            handle.flush()
            os.fsync(handle.fileno())
        seconds = time.perf_counter() - start
        path.unlink()
        return seconds

    def read_back():
        start = time.perf_counter()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        torch.save(state, f"/proc/self/fd/{fd}")
        mapped = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
        result = {}
        thread = threading.Thread(
            target=lambda: result.setdefault(
                "d", blake3.blake3(max_threads=blake3.blake3.AUTO).update(mapped)
            )
        )
        thread.start()
        os.fsync(fd)
        thread.join()
        mapped.close()
        os.close(fd)
        seconds = time.perf_counter() - start
        path.unlink()
        return seconds

    times = interleaved(
        {
            "file object, hashed while writing, fsync": while_writing,
            "to a path, read back from the page cache beside the fsync": read_back,
            "torch.save to a path + fsync (no digest)": torch_save_fsync(work, state),
        },
        rounds,
    )
    for label, values in times.items():
        show(label, values)


def prepare_dp(work: Path, steps: int) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "make_data.py"),
            "--out",
            str(work / "data"),
        ],
        check=True,
        capture_output=True,
    )
    config = json.loads((ROOT / "examples" / "input.json").read_text())
    config["training"].update(
        numb_steps=steps, save_freq=1, disp_freq=steps, max_ckpt_keep=3
    )
    config["training"].pop("_dp_ckpt", None)
    for name, extra in (("sync", {}), ("async", {"async_save": True}), ("off", None)):
        variant = json.loads(json.dumps(config))
        if extra is not None:
            variant["training"]["_dp_ckpt"] = extra
        (work / f"{name}.json").write_text(json.dumps(variant))


_STAMP = r"\[(\d+-\d+-\d+ \d+:\d+:\d+,\d+)\][^\n]*"


def dp_loop_seconds(
    work: Path,
    variant: str,
    steps: int,
    backend: str = "pt-expt",
    baseline: Path | None = None,
) -> float:
    """Train from scratch with ``dp --<backend>``; return the seconds of its loop.

    With ``baseline``, the plugin is imported from that source tree instead.
    """
    from datetime import datetime

    for name in ("models", "checkpoint", "model.ckpt.pt", "lcurve.out"):
        path = work / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for stale in work.glob("model.ckpt*.pt"):
        stale.unlink()
    env = {**os.environ, **THREADS}
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(baseline), *filter(None, [env.get("PYTHONPATH")])]
        )
    if variant == "off":
        env["DP_CKPT_DISABLE"] = "1"
    if variant.startswith("async-"):  # the writer: async-process, async-thread
        env["DP_CKPT_WRITER"] = variant.removeprefix("async-")
        variant = "async"
    out = subprocess.run(
        [
            str(BIN / "dp"),
            f"--{backend}",
            "train",
            f"{variant}.json",
            "--skip-neighbor-stat",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    # from the start of the loop to deepmd-kit's line about its last step
    text = out.stderr + out.stdout
    first = re.search(_STAMP + "Start to train", text)
    last = re.search(_STAMP + rf"Batch\s+{steps}: total wall time", text)
    first, last = (
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") for m in (first, last)
    )
    return (last - first).total_seconds()


def section_dp(
    work: Path, steps: int, rounds: int, baseline: Path | None = None
) -> None:
    for backend in ("pt-expt", "pt"):
        section_dp_backend(work, steps, rounds, backend, baseline)


def section_dp_backend(
    work: Path, steps: int, rounds: int, backend: str, baseline: Path | None = None
) -> None:
    print(
        f"\n[dp] dp --{backend} train, {steps} steps, a checkpoint every step, "
        f"{rounds} rounds"
    )
    work = work / f"dp-{backend}"
    work.mkdir()
    prepare_dp(work, steps)
    dp_loop_seconds(work, "off", steps, backend)  # warm the caches
    variants = {
        v: (lambda v=v: dp_loop_seconds(work, v, steps, backend))
        for v in ("off", "sync", "async-process", "async-thread")
    }
    if baseline is not None:  # the same background variants of another tree
        for v in ("async-process", "async-thread"):
            variants[f"{v} (baseline)"] = lambda v=v: dp_loop_seconds(
                work, v, steps, backend, baseline
            )
    times = interleaved(variants, rounds)
    for variant, values in times.items():
        show(f"training loop, plugin {variant}", values)
    for writer in ("process", "thread"):
        ratio = med(times[f"async-{writer}"]) / med(times["off"])
        report(
            "dp",
            f"dp --{backend}: training loop, background saves ({writer}) / plugin off",
            ratio,
            "<= 1.05",
            ratio <= 1.05,
        )
    ratio = med(times["sync"]) / med(times["off"])
    print(
        f"  {'training loop, synchronous saves / plugin off':60s} {ratio:9.3f}"
        "   (no target)"
    )
    for writer in ("process", "thread") if baseline is not None else ():
        ratio = med(times[f"async-{writer} (baseline)"]) / med(times["off"])
        label = f"baseline: background saves ({writer}) / plugin off"
        print(f"  {label:60s} {ratio:9.3f}   (no target)")


def section_import(rounds: int) -> None:
    print("\n[import] the deepmd.backend entry point, in a fresh process each time")
    code = (
        "import importlib, sys, time\n"
        "import deepmd.backend\n"
        "torch = 'torch' in sys.modules\n"
        "ours = [m for m in sys.modules if m.startswith('dp_ckpt_plugin')]\n"
        "for name in ours:\n"
        "    del sys.modules[name]\n"
        "start = time.perf_counter()\n"
        "importlib.import_module('dp_ckpt_plugin.deepmd.takeover')\n"
        "print(time.perf_counter() - start, torch, len(ours))\n"
    )
    seconds, torch_loaded = [], False
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        value, loaded, count = out.stdout.split()
        assert int(count) > 0, "the entry point was not loaded"
        seconds.append(float(value))
        torch_loaded |= loaded == "True"
    show("executing the plugin's modules", seconds)
    report(
        "import",
        "entry point imports torch (0: no)",
        float(torch_loaded),
        "0",
        not torch_loaded,
    )


# -- object storage -------------------------------------------------------------------


def section_remote(
    work: Path, mib: int, rounds: int, upload_mib: int, timed: bool = True
) -> None:
    """A remote ``save_dir`` on moto's S3 server, through ``CheckpointManager``.

    - upload throughput: :func:`bench_s3.section_s3` (the storage's put of a
      staged file against a plain ``obstore.put`` of the same bytes);
    - the save's stall: ``save()`` of a manager on ``s3://`` against one on a
      local directory, interleaved (the remote one's upload is waited for
      outside the timed region);
    - remote calls of one steady save with retention, counted by the storage;
    - requests and bytes of ``latest`` and of a steady save of a keep-all
      store of 10, 2,000 and 100,000 checkpoints, counted on the memory
      storage (:mod:`bench_remote_counts`); only these with ``timed=False``
      (``--counted``).
    """
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_remote_counts
    import bench_s3

    from dp_ckpt_plugin import CheckpointManager

    counted = bench_remote_counts.section_counts(work / "counted", make_state(1))
    requests = {c: (len(f["latest"]), len(f["save"])) for c, f in counted.items()}
    most = max(bench_remote_counts.COUNTS)
    report(
        "remote",
        f"requests of latest and of a steady save, {most:,} kept / 10 (<= 1)",
        sum(requests[most]) / sum(requests[10]),
        "<= 1",
        requests[most] == requests[10],
    )
    swap = {c: bench_remote_counts.swap_bytes(f["save"]) for c, f in counted.items()}
    report(
        "remote",
        f"bytes of a steady save's swap of HEAD, {most:,} kept (< 100,000)",
        swap[most],
        "< 100000",
        swap[most] < 100_000,
    )
    if not timed:
        return
    figures = bench_s3.section_s3(work, mib=upload_mib, rounds=rounds)
    report(
        "remote",
        f"upload {upload_mib} MiB / plain obstore.put (<= 1.1)",
        figures["ratio"],
        "<= 1.1",
        figures["ratio"] <= bench_s3.TARGET,
    )
    state = make_state(mib)
    print(
        f"\n[remote] save of {mib} MiB: s3:// (moto) against a local directory, "
        f"{rounds} rounds"
    )
    with bench_s3.moto_server() as endpoint:
        bench_s3._environment(endpoint)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench-remote")
        local = CheckpointManager(work / "local", format="torch", max_keep=2)
        remote = CheckpointManager(
            "s3://bench-remote/run",
            format="torch",
            max_keep=2,
            staging=work / "staging",
        )
        steps = {"local": 0, "remote": 0}

        def save(manager, name):
            def run():
                steps[name] += 1
                started = time.perf_counter()
                manager.save(steps[name], state)
                took = time.perf_counter() - started
                manager.flush(600)  # the upload, outside the timed region
                return took

            return run

        times = interleaved(
            {
                "local save_dir": save(local, "local"),
                "s3:// save_dir": save(remote, "remote"),
            },
            rounds,
        )
        for name, values in times.items():
            show(name, values)
        ratio = med(times["s3:// save_dir"]) / med(times["local save_dir"])
        report(
            "remote",
            f"save stall, s3:// / local, {mib} MiB (<= 1.1)",
            ratio,
            "<= 1.1",
            ratio <= 1.1,
        )
        storage = remote.store.remote.storage
        before = dict(storage.counts)
        steps["remote"] += 1
        remote.save(steps["remote"], state)
        remote.flush(600)
        calls = {k: v - before.get(k, 0) for k, v in storage.counts.items()}
        calls = {k: v for k, v in calls.items() if v}
        print(f"    remote calls of one steady save (keep 2): {calls}")
        from dp_ckpt_plugin.objectstore.cloud import PART_SIZE

        parts = -(-(mib << 20) // PART_SIZE)
        print(
            f"    that is: the payload in {parts} part(s) of a multipart put "
            f"(+ its start and completion), the record, one swap of HEAD, and the "
            f"two objects retention removed; {calls.get('requests', 0)} HTTP "
            "requests in all"
        )
        listing = calls.get("list", 0)
        report("remote", "listings in a steady save (0)", listing, "0", listing == 0)
        local.close()
        remote.close()


SECTIONS = [
    "save",
    "async",
    "crc",
    "strace",
    "count",
    "digest",
    "dp",
    "import",
    "remote",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 and 64 MiB only")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="these sections")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (at least 7)")
    parser.add_argument("--sizes", type=int, nargs="+", help="payload sizes, MiB")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--counted",
        action="store_true",
        help="the remote section's counted figures only (no moto server, no timing)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a source tree of dp_ckpt_plugin (an earlier commit's) whose "
        "savers the save section and background variants the dp section run "
        "beside this one's",
    )
    parser.add_argument("--child-steady", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_steady:
        kind, directory, mib = args.child_steady
        child_steady(kind, Path(directory), int(mib))
        return 0
    sections = args.only or SECTIONS
    rounds = args.rounds
    sizes = args.sizes or ([16, 64] if args.quick else [16, 64, 256])
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {rounds} rounds, "
        f"dp_ckpt_plugin from {Path(__import__('dp_ckpt_plugin').__file__).parent}"
    )
    with tempfile.TemporaryDirectory(dir=ROOT, prefix=".bench-") as tmp:
        work = Path(tmp)
        baseline = load_baseline(args.baseline) if args.baseline else None
        if "save" in sections:
            section_save(work, sizes, rounds, baseline)
        if "async" in sections:
            section_async(work, [s for s in sizes if s >= 64] or sizes, rounds)
        if "crc" in sections:
            section_crc(work, sizes, rounds)
        if "strace" in sections:
            section_strace(work, 32)
        if "count" in sections:
            section_count(work, [10, 2000], max(rounds, 15))
        if "digest" in sections:
            section_digest(work, max(sizes), rounds)
        if "dp" in sections:
            section_dp(work, 10 if args.quick else 20, rounds, args.baseline)
        if "import" in sections:
            section_import(rounds)
        if "remote" in sections:
            upload = 64 if args.quick else 256
            section_remote(work, 64, rounds, upload, timed=not args.counted)
    if args.json:
        args.json.write_text(json.dumps(RESULTS, indent=1) + "\n")
    missed = [r["figure"] for r in RESULTS if not r["met"]]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    for figure in missed:
        print(f"  MISSED: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
