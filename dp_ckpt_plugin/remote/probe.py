"""Does the storage really enforce the conditions it claims?

A remote store is safe with several writers only if create-if-absent and
compare-and-swap are enforced by the server. Some S3-compatible servers
accept the headers and ignore them. :func:`probe` tries both on a throwaway
key once per storage and process: a second create of the same key must be
refused, and a swap on a stale version must be refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading

from ..storage.forks import in_child
from ..storage.objects import (
    KeyExistsError,
    ObjectStorage,
    StorageUnavailableError,
    VersionMismatchError,
)
from .keys import PROBE_PREFIX

_PROBED: dict[str, str | None] = {}
_LOCK = threading.Lock()


@in_child
def _forked() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread's probe may have held it


def probe(storage: ObjectStorage) -> str | None:
    """``None`` if the conditions hold; otherwise what failed, in one phrase.

    The answer is kept per storage URL for the life of the process.

    Raises
    ------
    StorageUnavailableError
        When the storage cannot be reached at all (bucket missing, no
        credentials): the first call of a run says so before anything else.
    """
    with _LOCK:
        if storage.url in _PROBED:
            return _PROBED[storage.url]
    found = "this storage does not offer conditional writes"
    if storage.capabilities.conditional:
        found = _try(storage)
    with _LOCK:
        _PROBED[storage.url] = found
    return found


def _try(storage: ObjectStorage) -> str | None:
    key = f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        first = storage.put_if_absent(key, b"1")
        with contextlib.suppress(KeyExistsError):  # refused, as it must be
            storage.put_if_absent(key, b"2")
            return "a second create of the same object was accepted"
        second = storage.put_if_match(key, b"3", first.version)
        with contextlib.suppress(VersionMismatchError):
            storage.put_if_match(key, b"4", first.version)
            return "a swap on a stale version was accepted"
        if second.version == first.version:
            return "a replaced object kept its version"
        return None
    except (KeyExistsError, VersionMismatchError):
        return "a condition refused a write it should have let through"
    finally:
        with contextlib.suppress(StorageUnavailableError):
            storage.delete(key)
