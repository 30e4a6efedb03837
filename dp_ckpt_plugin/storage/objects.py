"""The object protocol: what a checkpoint store needs, in object-store primitives.

A storage that holds a remote checkpoint store (``save_dir: "s3://bucket/run"``)
offers whole objects under string keys, and a few conditions on writing them:

==================  ===========================================================
``put``             write a whole object (overwrite); large payloads are sent
                    in parts where the storage can (multipart upload)
``put_if_absent``   create an object only if its key is free, atomically
                    (:class:`KeyExistsError` otherwise)
``put_if_match``    replace an object only if it is still the version read
                    (compare-and-swap on the ETag or generation;
                    :class:`VersionMismatchError` otherwise)
``get``             a small object whole, with its version, bounded in size
``get_range``       a byte range of an object
``download``        an object streamed into an open file
``head``            what an object is (size, version, time), or ``None``
``list``            the objects under a key prefix (recovery only: never used
                    to find the latest checkpoint)
``delete``          remove an object (idempotent)
==================  ===========================================================

A *lease* is not a primitive of its own: it is one small object moved only by
``put_if_absent`` and ``put_if_match`` (:mod:`dp_ckpt_plugin.remote.lease`), so
it is exactly as safe as those two are on the storage. :class:`Capabilities`
says which conditions a storage really enforces; the remote store refuses
multi-writer safety where they are missing rather than pretend, and probes a
server that claims them (``dp_ckpt_plugin.remote.probe.probe``).

One implementation ships: ``dp_ckpt_plugin.objectstore.cloud.CloudStorage``
(S3, GCS and Azure through ``obstore``, with conditional requests); the
registry (``dp_ckpt_plugin.objectstore.registry``) picks a storage by URL
scheme. A local path is a directory store, never an object storage.

Errors: a condition that does not hold raises :class:`KeyExistsError` or
:class:`VersionMismatchError`; an object that is not there is ``None`` from
``get``/``head`` and :class:`KeyMissingError` from ``get_range``/``download``;
anything else that fails after the storage's own retries (a refused
credential, a server that stays away) raises :class:`StorageUnavailableError`
naming the URL and the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

from ..errors import CheckpointError, CheckpointWriteError

#: What ``put`` accepts: bytes (or a buffer), or an open binary file (a local
#: one opened through the storage layer) positioned at its start.
Source = bytes | bytearray | memoryview | BinaryIO

#: Most bytes ``get`` reads of a small object unless told otherwise.
SMALL_OBJECT_LIMIT = 1 << 20


class KeyExistsError(CheckpointError):
    """``put_if_absent``: an object already exists at the key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"an object already exists at {key}")
        self.key = key


class VersionMismatchError(CheckpointError):
    """``put_if_match``: the object is no longer the version that was read."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key} changed since it was read")
        self.key = key


class KeyMissingError(CheckpointError, FileNotFoundError):
    """An object that had to be there is not."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object at {key}")
        self.key = key


class StorageUnavailableError(CheckpointWriteError):
    """The storage could not be reached or refused a request, after retries.

    Attributes
    ----------
    url : str
        The object (or store) the request was for.
    cause : str
        What went wrong, in the storage's words, with no secret in it.
    """

    def __init__(self, url: str, what: str, cause: str) -> None:
        super().__init__(f"could not {what} {url}: {cause}")
        self.url = url
        self.cause = cause


class ObjectTooLargeError(StorageUnavailableError):
    """``get``: the object holds more bytes than the caller's limit (not read)."""

    def __init__(self, url: str, size: int, limit: int) -> None:
        super().__init__(url, "read", f"{size} bytes, more than {limit}")
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class Capabilities:
    """What a storage really does.

    Attributes
    ----------
    create_if_absent : bool
        ``put_if_absent`` is atomic: of two racing creators exactly one wins.
    compare_and_swap : bool
        ``put_if_match`` is atomic: a stale version is always refused.
    ranged_get : bool
        ``get_range`` reads only the range asked for.
    durable_put : bool
        An object is durable once ``put`` returns (no fsync to ask for).
    multipart : bool
        Large payloads are sent in parts, retried part by part.
    """

    create_if_absent: bool
    compare_and_swap: bool
    ranged_get: bool = True
    durable_put: bool = True
    multipart: bool = False

    @property
    def conditional(self) -> bool:
        """Whether both conditions a lease and a HEAD need are enforced."""
        return self.create_if_absent and self.compare_and_swap


@dataclass(frozen=True)
class ObjectInfo:
    """What an object is.

    Attributes
    ----------
    key : str
        Its key, relative to the storage's root.
    size : int
        Its size in bytes.
    version : str
        An opaque token that changes whenever the object is replaced (an
        ETag, a generation); what ``put_if_match`` compares.
    modified : float
        When it was last written, Unix time, as the storage's clock says.
    """

    key: str
    size: int
    version: str
    modified: float = 0.0


@runtime_checkable
class ObjectStorage(Protocol):
    """The primitives a remote store is built on (see the module docs).

    Keys are ``/``-separated strings relative to the storage's root (``url``),
    never starting with ``/`` and never holding ``..``; ``check_key``
    refuses others.
    """

    url: str
    capabilities: Capabilities

    def url_of(self, key: str) -> str: ...

    def put(self, key: str, data: Source) -> ObjectInfo: ...

    def put_if_absent(self, key: str, data: bytes) -> ObjectInfo: ...

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo: ...

    def get(
        self, key: str, limit: int = SMALL_OBJECT_LIMIT
    ) -> tuple[bytes, ObjectInfo] | None: ...

    def get_range(self, key: str, start: int, end: int) -> bytes: ...

    def download(self, key: str, sink: BinaryIO) -> ObjectInfo: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    def delete(self, key: str) -> bool: ...


#: What makes the storage of a URL: ``factory(url, **options)``.
StorageFactory = Callable[..., ObjectStorage]


@runtime_checkable
class ListsFolders(Protocol):
    """A storage that lists the folders directly under a prefix in one request."""

    def folders(self, prefix: str) -> list[str]:
        """The folder names (no ``/``) directly under ``prefix`` (``""`` or ending in ``/``)."""
        ...


@dataclass(frozen=True)
class PendingUpload:
    """An incomplete multipart upload.

    Attributes
    ----------
    key : str
        Its key, relative to the storage's root.
    upload_id : str
    initiated : float
        When it began, by the server's clock (Unix time).
    """

    key: str
    upload_id: str
    initiated: float


@runtime_checkable
class AbortsUploads(Protocol):
    """A storage that can list and abort incomplete multipart uploads."""

    aborts_uploads: bool

    def incomplete_uploads(self, prefix: str) -> tuple[list[PendingUpload], float]:
        """The incomplete uploads whose keys start with ``prefix``, and the server's time now."""
        ...

    def abort_upload(self, upload: PendingUpload) -> bool:
        """Abort one; ``False`` if it was gone already."""
        ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a plain relative key; raise ``ValueError`` if not."""
    if (
        not isinstance(key, str)
        or not key
        or key.startswith("/")
        or "\0" in key
        or any(part in ("", ".", "..") for part in key.split("/"))
    ):
        raise ValueError(f"not an object key: {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if ``list`` may take it (any start of a key, or ``""``).

    Raises ``ValueError`` for one that starts with ``/`` or climbs (``..``).
    """
    if (
        not isinstance(prefix, str)
        or prefix.startswith("/")
        or "\0" in prefix
        or ".." in prefix.split("/")
    ):
        raise ValueError(f"not a key prefix: {prefix!r}")
    return prefix
