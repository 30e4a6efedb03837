"""The keys of a remote store: one grammar, parsed once (nothing here touches a storage).

Every object a store under ``U`` writes has a key of this grammar,
relative to ``U``:

==========================================  ======================================
``HEAD``                                    the pointer object
``LEASE``                                   the writer lease
``e<epoch>/<name>``                         a payload (``<name>`` a numbered
                                            checkpoint name, ``model.ckpt-30.pt``)
``e<epoch>/v<n>/<name>``                    a re-save of it in the same run
``e<epoch>[/v<n>]/.<name>.commit.json``     its commit record
``archive/<YYYYmmddTHHMMSSZ>[-<n>].json``  an archived HEAD
``catalogue/e<epoch>-<n>.json``             a catalogue segment: older kept
                                            entries HEAD names (written
                                            once, never rewritten)
``.probe/<pid>-<hex>``                      the probe of conditional writes
==========================================  ======================================

``<epoch>`` is written ``%06d`` (``e000002``) and ``<n>`` in canonical decimal.
:func:`parse_key` is the one door for a key read from HEAD, a record, an
archive or a listing: it answers a :class:`StoreKey`, or ``None`` for
anything else, which is *not ours* (a nested store, a user's object, a
hostile name): never deleted, never downloaded as a checkpoint, never
shown raw.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from ..checkpoint.layout import parse_numbered, record_name, record_target
from ..checkpoint.limits import MAX_TEXT

#: The pointer object: what the store holds and which checkpoint is latest.
HEAD_KEY = "HEAD"
#: The writer lease.
LEASE_KEY = "LEASE"
#: Key prefix of archived runs' HEADs.
ARCHIVE_PREFIX = "archive/"
#: Key of the object the probe of conditional writes creates and removes.
PROBE_PREFIX = ".probe/"
#: Key prefix of catalogue segments.
SEGMENT_PREFIX = "catalogue/"

_EPOCH_DIR = re.compile(r"e(?P<epoch>[0-9]{6,})")
#: A payload's or record's key: its epoch's folder, ``v<n>/`` of a re-save, a name.
_OBJECT = re.compile(r"(?P<folder>[^/]+)/(?:v(?P<upload>[1-9][0-9]*)/)?(?P<last>[^/]+)")
_ARCHIVE = re.compile(r"archive/[0-9]{8}T[0-9]{6}Z(-[1-9][0-9]{0,3})?\.json")
_PROBE = re.compile(r"\.probe/[0-9]+-[0-9a-f]{8}")
_SEGMENT = re.compile(r"catalogue/e(?P<epoch>[0-9]{6,})-(?P<n>0|[1-9][0-9]*)\.json")

#: The kinds of key a store writes.
HEAD, LEASE, ARCHIVE, PAYLOAD = "head", "lease", "archive", "payload"
RECORD, PROBE, SEGMENT = "record", "probe", "segment"


@dataclass(frozen=True)
class StoreKey:
    """A key of the store's own grammar (see the module docs).

    Attributes
    ----------
    text : str
        The key, relative to the store's URL.
    kind : str
        ``head``, ``lease``, ``archive``, ``payload``, ``record``, ``probe``
        or ``segment``.
    epoch : int or None
        The epoch of a payload, record or segment.
    name : str or None
        The checkpoint a payload is, or a record describes.
    upload : int
        0, or ``n`` of a re-save under ``v<n>/`` (of a segment: its number).
    """

    text: str
    kind: str
    epoch: int | None = None
    name: str | None = None
    upload: int = 0

    def __str__(self) -> str:
        return self.text

    @property
    def payload(self) -> StoreKey | None:
        """The payload a record describes (itself for a payload)."""
        if self.kind == RECORD:
            text = payload_key(self.epoch, self.name, self.upload)
            return replace(self, text=text, kind=PAYLOAD)
        return self if self.kind == PAYLOAD else None

    @property
    def record(self) -> StoreKey | None:
        """The commit record of a payload (itself for a record)."""
        if self.kind == PAYLOAD:
            return replace(self, text=record_key(self.text), kind=RECORD)
        return self if self.kind == RECORD else None


def epoch_dir(epoch: int) -> str:
    """The folder of the objects written under ``epoch``: ``e000002``."""
    return f"e{epoch:06d}"


def parse_epoch_dir(text: str) -> int | None:
    """The epoch of a folder name written by :func:`epoch_dir`, or ``None``."""
    found = _EPOCH_DIR.fullmatch(text)
    if found is None:
        return None
    epoch = int(found.group("epoch"))
    return epoch if epoch_dir(epoch) == text else None


def checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a numbered checkpoint name a store may write."""
    return (
        0 < len(name) <= MAX_TEXT
        and name.isprintable()
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and parse_numbered(name) is not None
    )


def parse_key(text: object) -> StoreKey | None:
    """The key ``text`` read from outside, typed; ``None`` when it is not ours."""
    if type(text) is not str or not 0 < len(text) <= MAX_TEXT:
        return None
    if text == HEAD_KEY:
        return StoreKey(text, HEAD)
    if text == LEASE_KEY:
        return StoreKey(text, LEASE)
    if _ARCHIVE.fullmatch(text):
        return StoreKey(text, ARCHIVE)
    if _PROBE.fullmatch(text):
        return StoreKey(text, PROBE)
    found = _SEGMENT.fullmatch(text)
    if found is not None:
        epoch = int(found.group("epoch"))
        if segment_key(epoch, int(found.group("n"))) != text:
            return None
        return StoreKey(text, SEGMENT, epoch, upload=int(found.group("n")))
    found = _OBJECT.fullmatch(text)
    epoch = parse_epoch_dir(found.group("folder")) if found is not None else None
    if epoch is None:
        return None
    upload, last = int(found.group("upload") or 0), found.group("last")
    if checkpoint_name(last):
        return StoreKey(text, PAYLOAD, epoch, last, upload)
    target = record_target(last)
    if target is not None and checkpoint_name(target):
        return StoreKey(text, RECORD, epoch, target, upload)
    return None


def owned(text: object) -> bool:
    """Whether a store may ever delete ``text``: a payload, record or segment of its grammar."""
    key = parse_key(text)
    return key is not None and key.kind in (PAYLOAD, RECORD, SEGMENT)


def segment_key(epoch: int, n: int) -> str:
    """The key of catalogue segment ``n`` written by a writer of ``epoch``."""
    return f"{SEGMENT_PREFIX}{epoch_dir(epoch)}-{n}.json"


def payload_key(epoch: int, name: str, upload: int = 0) -> str:
    """Where a payload named ``name`` goes; ``upload`` > 0 for a re-save of it."""
    folder = epoch_dir(epoch)
    return f"{folder}/{name}" if upload == 0 else f"{folder}/v{upload}/{name}"


def record_key(payload: str) -> str:
    """The key of the commit record beside ``payload``."""
    folder, _, name = payload.rpartition("/")
    return f"{folder}/{record_name(name)}" if folder else record_name(name)


def archive_key(when: float | None = None, again: int = 0) -> str:
    """A fresh key for an archived HEAD, named by the UTC time (``-<again>`` if taken)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return f"{ARCHIVE_PREFIX}{stamp}{f'-{again}' if again else ''}.json"
