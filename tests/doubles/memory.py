"""An object storage held in the process: ``memory://<bucket>/<prefix>``.

Every condition is checked and applied under one lock, so ``put_if_absent``
and ``put_if_match`` are exactly atomic: of racing writers one wins, always.
That makes it the storage the race and fault tests of the remote store run
on, beside a real S3 server (whose conditions may be checked without a
lock). Buckets are shared by name inside the process, so two
``MemoryStorage("memory://b/run")`` see the same objects, as two processes
would see one bucket.

Tests can make any call fail (:meth:`MemoryStorage.fail`) or run code just
before a call is carried out (:meth:`MemoryStorage.before`): a writer paused
between reading HEAD and swapping it, a server that answers 503.

A test double, not part of the package: the tests serve ``memory://`` with
it through a plugin (:func:`serve_memory`, called by ``tests/conftest.py``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.storage.forks import in_child
from dp_ckpt_plugin.storage.objects import (
    SMALL_OBJECT_LIMIT,
    Capabilities,
    KeyExistsError,
    KeyMissingError,
    ObjectInfo,
    ObjectTooLargeError,
    Source,
    StorageUnavailableError,
    VersionMismatchError,
    check_key,
    check_prefix,
)


@dataclass
class _Bucket:
    objects: dict[str, tuple[bytes, ObjectInfo]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0


_BUCKETS: dict[str, _Bucket] = {}
_BUCKETS_LOCK = threading.Lock()


@in_child
def _forked() -> None:
    """Locks another thread may have held at the fork are made anew."""
    global _BUCKETS_LOCK
    _BUCKETS_LOCK = threading.Lock()
    for bucket in _BUCKETS.values():
        bucket.lock = threading.Lock()


def _bucket(name: str) -> _Bucket:
    with _BUCKETS_LOCK:
        return _BUCKETS.setdefault(name, _Bucket())


def forget(bucket: str) -> None:
    """Drop a bucket and everything in it (tests start from nothing)."""
    with _BUCKETS_LOCK:
        _BUCKETS.pop(bucket, None)


@dataclass
class _Fault:
    op: str
    key: Callable[[str], bool]
    error: Callable[[str], BaseException]
    times: int
    after: bool = False


class MemoryStorage:
    """Objects in a dict of the process, conditions under a lock.

    Parameters
    ----------
    url : str
        ``memory://<bucket>`` or ``memory://<bucket>/<prefix>``.
    """

    capabilities = Capabilities(
        create_if_absent=True, compare_and_swap=True, ranged_get=True
    )

    def __init__(self, url: str) -> None:
        rest = url.removeprefix("memory://")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"a memory URL names a bucket: {url!r}")
        self.url = f"memory://{join_key(bucket, prefix)}"
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._bucket = _bucket(bucket)
        #: Calls made, by primitive (``put``, ``put_if_match``, ...).
        self.counts: Counter[str] = Counter()
        self._faults: list[_Fault] = []
        self._before: list[tuple[str, Callable[[str], None]]] = []
        self._hooks_lock = threading.Lock()

    # -- tests' handles -------------------------------------------------------
    def fail(
        self,
        op: str,
        error: Callable[[str], BaseException] | None = None,
        *,
        key: str | Callable[[str], bool] | None = None,
        times: int = 1,
        after: bool = False,
    ) -> None:
        """Make the next ``times`` calls of ``op`` (on ``key``) raise ``error``.

        ``error(key)`` builds the exception; a 503-like
        :class:`~dp_ckpt_plugin.storage.objects.StorageUnavailableError` by default. With ``after``, the call
        is carried out first and its answer lost (a timeout after success).
        """
        match = key if callable(key) else (lambda k, want=key: want in (None, k))
        build = error or (
            lambda k: StorageUnavailableError(
                self.url_of(k) if k else self.url, op, "503 Slow Down (injected)"
            )
        )
        with self._hooks_lock:
            self._faults.append(_Fault(op, match, build, times, after))

    def before(self, op: str, action: Callable[[str], None]) -> None:
        """Run ``action(key)`` before each call of ``op`` (``"*"``: every call)."""
        with self._hooks_lock:
            self._before.append((op, action))

    def clear_hooks(self) -> None:
        """Forget every fault and action."""
        with self._hooks_lock:
            self._faults.clear()
            self._before.clear()

    def _enter(self, op: str, key: str) -> str:
        self._call(op, key)
        return self._full(key)

    def _call(self, op: str, key: str) -> None:
        self.counts[op] += 1
        with self._hooks_lock:
            actions = [a for o, a in self._before if o in (op, "*")]
        for action in actions:
            action(key)
        fault = self._fault(op, key, after=False)
        if fault is not None:
            raise fault.error(key)

    def _fault(self, op: str, key: str, *, after: bool) -> _Fault | None:
        with self._hooks_lock:
            for fault in self._faults:
                if (
                    fault.after == after
                    and fault.op in (op, "*")
                    and fault.times > 0
                    and fault.key(key)
                ):
                    fault.times -= 1
                    return fault
        return None

    def _answer(self, op: str, key: str, value):
        """``value``, unless a fault loses the answer of this call."""
        fault = self._fault(op, key, after=True)
        if fault is not None:
            raise fault.error(key)
        return value

    # -- the protocol ---------------------------------------------------------
    def _full(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def url_of(self, key: str) -> str:
        """The URL of the object at ``key``."""
        return f"{self.url}/{check_key(key)}"

    def _store(self, full: str, key: str, data: bytes) -> ObjectInfo:
        bucket = self._bucket
        bucket.serial += 1
        info = ObjectInfo(key, len(data), f"m{bucket.serial}", time.time())
        bucket.objects[full] = (data, info)
        return info

    def put(self, key: str, data: Source) -> ObjectInfo:
        """Write a whole object, replacing any."""
        full = self._enter("put", key)
        payload = _read_source(data)
        with self._bucket.lock:
            info = self._store(full, key, payload)
        return self._answer("put", key, info)

    def put_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        """Create an object; :class:`~dp_ckpt_plugin.storage.objects.KeyExistsError` if one is there."""
        full = self._enter("put_if_absent", key)
        with self._bucket.lock:
            if full in self._bucket.objects:
                raise KeyExistsError(self.url_of(key))
            info = self._store(full, key, bytes(data))
        return self._answer("put_if_absent", key, info)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace an object that is still ``version``; :class:`~dp_ckpt_plugin.storage.objects.VersionMismatchError` if not."""
        full = self._enter("put_if_match", key)
        with self._bucket.lock:
            found = self._bucket.objects.get(full)
            if found is None or found[1].version != version:
                raise VersionMismatchError(self.url_of(key))
            info = self._store(full, key, bytes(data))
        return self._answer("put_if_match", key, info)

    def get(
        self, key: str, limit: int = SMALL_OBJECT_LIMIT
    ) -> tuple[bytes, ObjectInfo] | None:
        """A small object and its version; ``None`` when absent."""
        full = self._enter("get", key)
        with self._bucket.lock:
            found = self._bucket.objects.get(full)
        if found is None:
            return None
        data, info = found
        if info.size > limit:
            raise ObjectTooLargeError(self.url_of(key), info.size, limit)
        return data, info

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of an object."""
        full = self._enter("get_range", key)
        with self._bucket.lock:
            found = self._bucket.objects.get(full)
        if found is None:
            raise KeyMissingError(self.url_of(key))
        return found[0][start:end]

    def download(self, key: str, sink: BinaryIO) -> ObjectInfo:
        """Write an object into ``sink``; return what it was."""
        full = self._enter("download", key)
        with self._bucket.lock:
            found = self._bucket.objects.get(full)
        if found is None:
            raise KeyMissingError(self.url_of(key))
        sink.write(found[0])
        return found[1]

    def head(self, key: str) -> ObjectInfo | None:
        """What the object at ``key`` is, or ``None``."""
        full = self._enter("head", key)
        with self._bucket.lock:
            found = self._bucket.objects.get(full)
        return None if found is None else found[1]

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """The objects whose keys start with ``prefix`` (relative to the root)."""
        self._call("list", check_prefix(prefix))
        root = f"{self.prefix}/" if self.prefix else ""
        base = root + prefix
        with self._bucket.lock:
            found = [
                replace(info, key=full[len(root) :])
                for full, (_, info) in sorted(self._bucket.objects.items())
                if full.startswith(base)
            ]
        return iter(found)

    def folders(self, prefix: str) -> list[str]:
        """The folder names directly under ``prefix`` (``""`` or ending in ``/``)."""
        self._call("list", check_prefix(prefix))
        base = (f"{self.prefix}/" if self.prefix else "") + prefix
        with self._bucket.lock:
            fulls = list(self._bucket.objects)
        rests = [f[len(base) :] for f in fulls if f.startswith(base)]
        return sorted({r.partition("/")[0] for r in rests if "/" in r})

    def delete(self, key: str) -> bool:
        """Remove an object; ``False`` if it was not there."""
        full = self._enter("delete", key)
        with self._bucket.lock:
            gone = self._bucket.objects.pop(full, None) is not None
        return self._answer("delete", key, gone)


class MemoryPlugin:
    """The plugin offering ``memory://`` (``register_storages``)."""

    @hookimpl
    def register_storages(self) -> dict:
        return {"memory": _storage}


def join_key(*parts: str) -> str:
    """Join key parts with ``/`` (empty parts are dropped)."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def serve_memory() -> None:
    """Serve ``memory://`` URLs with :class:`MemoryStorage` in this process.

    Registers :class:`MemoryPlugin` on the process's plugin manager, as a
    third party's storage plugin would be, once.
    """
    from dp_ckpt_plugin.objectstore.registry import plugin_manager

    pm = plugin_manager()
    if not pm.has_plugin("memory"):
        pm.register(MemoryPlugin(), name="memory")


def _storage(url: str, **options) -> MemoryStorage:
    """The storage of a ``memory://`` URL, as the registry asks for one."""
    if options:
        raise ConfigError(
            f"{url}: a memory storage takes no options ({', '.join(options)})"
        )
    try:
        return MemoryStorage(url)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _read_source(data: Source) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    out = bytearray()
    chunk = data.read(1 << 20)
    while chunk:
        out += chunk
        chunk = data.read(1 << 20)
    return bytes(out)
