"""Content digests of checkpoints, computed in one pass over the bytes.

A commit record names its digest as ``"<algorithm>:<hex>"``. New records use
BLAKE3: a cryptographic hash that runs at about twice the speed of SHA-256
here (``benchmarks/run.py`` measures sha256, blake3 and xxh3 side by side;
see ``docs/performance.md``), so it detects any corruption (bad disk, partial
copy, a flipped bit) at a cost the write hides. Records written before it name
``sha256`` and still verify.

:class:`HashingWriter` hashes the bytes a format writes while it writes them,
on a thread of its own (hashlib and blake3 release the GIL on large buffers),
so the file is never read back to be hashed. A format that seeks back and
overwrites (HDF5 does) makes the streamed digest invalid; the caller then
hashes the finished file once.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path
from typing import Any, BinaryIO

#: The algorithm of new records.
DEFAULT_ALGORITHM = "blake3"
#: Every algorithm a record may name, by the length of its hex digest.
ALGORITHMS = {"blake3": 64, "sha256": 64}
_CHUNK = 1 << 20
#: Attributes of the file that neither move its position nor change its bytes.
_NEUTRAL = frozenset(
    {"flush", "fileno", "closed", "mode", "name", "writable", "readable", "seekable"}
)
#: Writes smaller than this are copied before hashing (the writer may reuse
#: its buffer); larger ones are the payload's own memory, kept alive until
#: hashed.
_COPY_BELOW = 1 << 20


def hasher(algorithm: str) -> Any:
    """Return a fresh hash object of ``algorithm`` (``update`` / ``hexdigest``)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def digest_of(
    path: Path, algorithm: str = DEFAULT_ALGORITHM, *, storage: Any = None
) -> str:
    """Return ``"<algorithm>:<hex>"`` of a file's content, reading it once.

    The file is opened through ``storage`` (the default local storage when
    ``None``): only a regular file is read.
    """
    if storage is None:
        from .storage import default_storage

        storage = default_storage()
    with storage.open_payload(path) as handle:
        return digest_of_handle(handle, algorithm)


def digest_of_handle(handle: BinaryIO, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """Return ``"<algorithm>:<hex>"`` of what ``handle`` reads to its end."""
    h = hasher(algorithm)
    while chunk := handle.read(_CHUNK):
        h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"


class HashingWriter:
    """A file object that hashes what is written to it, on another thread.

    Parameters
    ----------
    handle : BinaryIO
        The real file; every other method is passed through.
    algorithm : str
        The digest algorithm.
    """

    def __init__(self, handle: BinaryIO, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self._handle = handle
        self.algorithm = algorithm
        self._hash = hasher(algorithm)
        self._end = handle.tell()
        self._position = self._end
        self._sequential = self._end == 0
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._small = bytearray()
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()
        self._error: BaseException | None = None

    def _consume(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            try:
                self._hash.update(chunk)
            except BaseException as exc:
                self._error = exc

    def write(self, data) -> int:
        """Write ``data`` and hash it (if it extends the file).

        Small writes (a pickle's records, zip headers) are gathered into one
        buffer and handed to the hashing thread a megabyte at a time; large
        ones (tensor data) are handed over as they are, in order.
        """
        position = self._position
        written = self._handle.write(data)
        self._position = position + written
        if not (self._sequential and position == self._end):
            self._sequential = False
            self._end = max(self._end, position + written)
            return written
        self._end += written
        view = memoryview(data).cast("B")
        if view.nbytes < _COPY_BELOW:
            self._small += view
            if len(self._small) >= _COPY_BELOW:
                self._flush_small()
        else:
            self._flush_small()
            self._queue.put(view)
        return written

    def _flush_small(self) -> None:
        if self._small:
            self._queue.put(bytes(self._small))
            self._small.clear()

    def seek(self, offset: int, whence: int = 0) -> int:
        """Seek the real file; a later write that does not extend it voids the digest."""
        self._position = self._handle.seek(offset, whence)
        return self._position

    def tell(self) -> int:
        """The position, without asking the file."""
        return self._position

    def digest(self) -> str | None:
        """Finish hashing; return ``"<algorithm>:<hex>"``, or ``None`` if voided."""
        self._flush_small()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None or not self._sequential:
            return None
        if self._handle.seek(0, 2) != self._end:
            return None
        return f"{self.algorithm}:{self._hash.hexdigest()}"

    def __getattr__(self, name: str) -> Any:
        if name not in _NEUTRAL:
            # reading, truncating, ...: the position is no longer known here
            self._sequential = False
        return getattr(self._handle, name)
