"""Upload throughput to S3: CloudStorage.put of a file against a plain obstore.put.

The server is moto's S3 server on 127.0.0.1, in a process of its own so that
it does not share the client's interpreter. Each round puts the same bytes
(``--mib``, 256 by default) once with a bare ``obstore.put`` of the buffer
(obstore's own defaults) and once the way the uploader sends a staged
checkpoint: the file mapped read-only through the local storage
(``map_payload``: the page cache, no read call, no disk in the timed region)
and the view handed to :meth:`CloudStorage.put`, interleaved, and prints the
min and the median of each, the ratio of the medians (target: at most 1.1)
and the client's CPU seconds per put (the server's are not counted). ``--sweep`` also times the part sizes and concurrencies the
storage's constants were chosen from. Run::

    .venv/bin/python benchmarks/bench_s3.py              # 256 MiB, 7 rounds
    .venv/bin/python benchmarks/bench_s3.py --sweep      # and the part sweep

:func:`section_s3` is the section for ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: The ratio of medians the storage's put may reach against a plain put.
TARGET = 1.1
#: (part MiB, concurrency) pairs of ``--sweep``.
SWEEP = [(5, 12), (8, 4), (8, 8), (16, 2), (16, 4), (16, 8), (32, 4), (64, 4)]

_SERVER = """
import logging, sys, time
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in a child process; yields its endpoint."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _environment(endpoint: str) -> None:
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)


def _bucket(endpoint: str) -> str:
    import boto3

    name = "bench-upload"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def interleaved(
    variants: dict[str, Callable[[], object]], rounds: int, cpu: dict | None = None
) -> dict:
    """Seconds of each variant per round, run in turn round by round.

    With ``cpu``, this process's CPU seconds of each round go there too.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            used = time.process_time()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - used)
    return times


def _show(label: str, values: list[float], mib: int, cpu: list[float]) -> None:
    median = statistics.median(values)
    print(
        f"    {label:46s} min {min(values):6.2f} s   median {median:6.2f} s   "
        f"({mib / median:5.0f} MiB/s; client CPU {statistics.median(cpu):5.3f} s)"
    )


def _put_file(storage, path: Path):
    """What the uploader does: map the staged file, hand the view to ``put``."""
    from dp_ckpt_plugin.storage import default_storage

    with default_storage().map_payload(path) as view:
        return storage.put("payload", view)


def section_s3(
    work: Path, mib: int = 256, rounds: int = 7, sweep: bool = False
) -> dict:
    """Time both puts; return the figures (medians, ratio, requests per put)."""
    import obstore
    from obstore.store import S3Store

    from dp_ckpt_plugin.objectstore import cloud

    data = os.urandom(mib << 20)
    path = work / "payload.bin"
    path.write_bytes(data)
    print(f"\n[s3] upload of {mib} MiB to moto's S3 server, {rounds} rounds")
    with moto_server() as endpoint:
        _environment(endpoint)
        bucket = _bucket(endpoint)
        plain = S3Store(bucket, endpoint=endpoint, client_options={"allow_http": True})
        storage = cloud.CloudStorage(f"s3://{bucket}/run")
        variants = {
            "obstore.put of the buffer (its defaults)": lambda: obstore.put(
                plain, "plain/payload", data
            ),
            "the uploader: the file mapped, CloudStorage.put": lambda: _put_file(
                storage, path
            ),
        }
        if sweep:
            for part, concurrency in SWEEP:
                variants[f"obstore.put of the file, {part} MiB x {concurrency}"] = (
                    lambda part=part, concurrency=concurrency: obstore.put(
                        plain,
                        f"sweep/{part}x{concurrency}",
                        path,
                        chunk_size=part << 20,
                        max_concurrency=concurrency,
                    )
                )
        before = storage.counts["requests"]
        cpu: dict[str, list[float]] = {}
        times = interleaved(variants, rounds, cpu)
        requests = (storage.counts["requests"] - before) // rounds
    for label, values in times.items():
        _show(label, values, mib, cpu[label])
    names = list(variants)
    ratio = statistics.median(times[names[1]]) / statistics.median(times[names[0]])
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(
        f"    ratio of medians, CloudStorage / obstore: {ratio:.2f} "
        f"(target <= {TARGET}: {verdict}); {requests} requests per put "
        f"({cloud.PART_SIZE >> 20} MiB parts, {cloud.PART_CONCURRENCY} at a time)"
    )
    return {
        "medians": {k: statistics.median(v) for k, v in times.items()},
        "ratio": ratio,
        "requests": requests,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="payload size, MiB")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (at least 7)")
    parser.add_argument("--sweep", action="store_true", help="also time part sizes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        found = section_s3(Path(work), args.mib, args.rounds, args.sweep)
    return 0 if found["ratio"] <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
