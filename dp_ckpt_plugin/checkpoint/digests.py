"""Content digests of checkpoints, computed in one pass over the bytes.

A commit record names its digest as ``"<algorithm>:<hex>"``. New records use
BLAKE3: a cryptographic hash that runs at about twice the speed of SHA-256
here (``benchmarks/run.py`` measures sha256, blake3 and xxh3 side by side;
see ``docs/performance.md``), so it detects any corruption (bad disk, partial
copy, a flipped bit) at a cost the write hides. Records written before it name
``sha256`` and still verify.

:func:`digest_of_view` hashes a new payload from a read-only map of the
file just written (the page cache, no copy), on every core, while the storage
fsyncs it; it replaced hashing the format's writes on their way out, which
cost more than the write itself (see ``docs/performance.md``). Any format
works the same way, also one that seeks back and overwrites (HDF5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ..storage import Storage, default_storage
from ..storage.forks import in_child

#: The algorithm of new records.
DEFAULT_ALGORITHM = "blake3"
#: Every algorithm a record may name, by the length of its hex digest.
ALGORITHMS = {"blake3": 64, "sha256": 64}
_CHUNK = 1 << 20
#: Buffers from this size on are hashed on several threads (BLAKE3).
_PARALLEL_ABOVE = 4 << 20
#: Whether BLAKE3's thread pool was started in this process, and whether it
#: may be used: not in a child forked after that (its threads are not there,
#: and a hash waiting for them would never return).
_POOL = {"started": False, "usable": True}


@in_child
def _forked() -> None:
    if _POOL["started"]:
        _POOL["usable"] = False


def hasher(algorithm: str) -> Any:
    """Return a fresh hash object of ``algorithm`` (``update`` / ``hexdigest``)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def digest_of(
    path: Path, algorithm: str = DEFAULT_ALGORITHM, *, storage: Storage | None = None
) -> str:
    """Return ``"<algorithm>:<hex>"`` of a file's content, reading it once.

    The file is opened through ``storage`` (the default local storage when
    ``None``): only a regular file is read.
    """
    h = hasher(algorithm)
    with (storage or default_storage()).open_payload(path) as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"


def digest_of_view(view: memoryview, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Return ``"<algorithm>:<hex>"`` of bytes in memory (a map of a file, say).

    BLAKE3 hashes a large buffer on every core (``max_threads``), releasing
    the GIL; small ones on one, and every one in a child forked after the
    pool started (see ``storage/forks.py``).
    """
    if algorithm == "blake3" and view.nbytes >= _PARALLEL_ABOVE and _POOL["usable"]:
        from blake3 import blake3

        _POOL["started"] = True
        h = blake3(max_threads=blake3.AUTO)
    else:
        h = hasher(algorithm)
    h.update(view)
    return f"{algorithm}:{h.hexdigest()}"


def write_hashed(
    path: Path,
    serialize: Callable[[BinaryIO], object],
    *,
    durable: bool,
    storage: Storage,
) -> tuple[Path, str]:
    """Write a payload to a temporary file beside ``path`` and hash it.

    Returns the temporary path and its digest, computed from the bytes in
    the page cache while the file is fsynced (``Storage.write_payload``);
    the format's writes pass through no hashing wrapper.
    """
    in_process = getattr(serialize, "write_in_process", None)
    if in_process is not None:  # a snapshot the writer process writes
        return in_process(path, durable=durable)
    return storage.write_payload(
        path, serialize, durable=durable, digest=digest_of_view
    )
