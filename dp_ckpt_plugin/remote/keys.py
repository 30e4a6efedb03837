"""Object keys of a remote store (nothing here touches a storage)."""

from __future__ import annotations

import re
import time

from ..checkpoint.layout import record_name

#: The pointer object: what the store holds and which checkpoint is latest.
HEAD_KEY = "HEAD"
#: The writer lease.
LEASE_KEY = "LEASE"
#: Key prefix of archived runs' HEADs.
ARCHIVE_PREFIX = "archive/"
#: Key of the object the probe of conditional writes creates and removes.
PROBE_PREFIX = ".probe/"
_EPOCH_DIR = re.compile(r"e(?P<epoch>[0-9]{6,})")


def epoch_dir(epoch: int) -> str:
    """The folder of the objects written under ``epoch``: ``e000002``."""
    return f"e{epoch:06d}"


def epoch_of(key: str) -> int | None:
    """The epoch a payload or record key lies under, or ``None``."""
    head, sep, _ = key.partition("/")
    found = _EPOCH_DIR.fullmatch(head) if sep else None
    return int(found.group("epoch")) if found else None


def payload_key(epoch: int, name: str, upload: int = 0) -> str:
    """Where a payload named ``name`` goes; ``upload`` > 0 for a re-save of it."""
    folder = epoch_dir(epoch)
    return f"{folder}/{name}" if upload == 0 else f"{folder}/v{upload}/{name}"


def record_key(payload: str) -> str:
    """The key of the commit record beside ``payload``."""
    folder, _, name = payload.rpartition("/")
    return f"{folder}/{record_name(name)}" if folder else record_name(name)


def name_of(key: str) -> str:
    """The file name of a payload key (its last part)."""
    return key.rpartition("/")[2]


def archive_key(when: float | None = None) -> str:
    """A fresh key for an archived HEAD, named by the UTC time."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return f"{ARCHIVE_PREFIX}{stamp}.json"
