"""An object storage on S3, GCS or Azure: ``s3://bucket/prefix`` through obstore.

==================  ===========================================================
``put``             ``obstore.put``: one request up to :data:`PART_SIZE`, a
                    multipart upload of :data:`PART_SIZE` parts,
                    :data:`PART_CONCURRENCY` at a time, above it; a
                    :class:`~pathlib.Path` is streamed from the file
``put_if_absent``   ``mode="create"`` (``If-None-Match: *``)
``put_if_match``    ``mode={"e_tag": version}`` (``If-Match``; on GCS the
                    generation, ``x-goog-if-generation-match``)
``get``             one ``GET``; its size is read from the answer's headers
                    and a body larger than ``limit`` is never read
``get_range``       a ranged ``GET``
``download``        ``HEAD``, then ranged ``GET`` s of :data:`DOWNLOAD_PART`
                    bytes, each on the version first seen (``If-Match``),
                    streamed into the sink
``head``            ``HEAD``
``list``            ``LIST`` of the prefix's folder, filtered to the prefix
``delete``          ``HEAD`` then ``DELETE``
==================  ===========================================================

:attr:`ObjectInfo.version <dp_ckpt_plugin.storage.objects.ObjectInfo.version>`
is the ETag on S3 and Azure, the generation on GCS: what the store compares.

Settings come the way users already give them (:mod:`.aws` for S3, through
botocore's credential chain; obstore reads ``GOOGLE_*`` and ``AZURE_*``
itself). Transient errors (5xx, timeouts,
refused or reset connections) are retried by obstore with
:data:`RETRIES` retries and exponential backoff, within
:data:`RETRY_TIMEOUT`, so a dead endpoint fails in seconds; then one
:class:`~dp_ckpt_plugin.storage.objects.StorageUnavailableError` names the
URL and the cause in one line, with every credential scrubbed.

obstore is imported when a storage is made, never when this module is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import BinaryIO, TypeVar
from urllib.parse import urlsplit

from ..errors import ConfigError, ForkedError
from ..storage.forks import in_child
from ..storage.objects import (
    SMALL_OBJECT_LIMIT,
    Capabilities,
    KeyExistsError,
    KeyMissingError,
    ObjectInfo,
    ObjectTooLargeError,
    PendingUpload,
    Source,
    StorageUnavailableError,
    VersionMismatchError,
    check_key,
    check_prefix,
)
from ..text import scrub_url, shown
from . import aws

#: Size of one part of a multipart upload (and the largest single-request put).
PART_SIZE = 16 << 20
#: Parts of one upload in flight at once.
PART_CONCURRENCY = 4
#: Bytes of one ranged ``GET`` of :meth:`CloudStorage.download`.
DOWNLOAD_PART = 64 << 20
#: Least bytes handed to the sink at a time while downloading.
STREAM_CHUNK = 1 << 20
#: Retries of a request that met a transient error.
RETRIES = 3
#: First and longest pause between retries (seconds; doubled each retry).
FIRST_BACKOFF = 0.2
MAX_BACKOFF = 2.0
#: No retry is started this many seconds after a request's first attempt.
RETRY_TIMEOUT = 15.0
#: Seconds to wait for a connection.
CONNECT_TIMEOUT = 3.0
#: Seconds one request (a part, a range) may take in all.
REQUEST_TIMEOUT = 120.0
#: Times a conditional put answered ``409 Conflict`` (a concurrent
#: conditional write in flight) is sent again.
CONFLICT_RETRIES = 3

#: Scheme -> obstore's kind of store.
SCHEMES = {"s3": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}

#: What every kind of store enforces (obstore implements both conditional
#: modes on S3, GCS and Azure).
CAPABILITIES = Capabilities(
    create_if_absent=True, compare_and_swap=True, multipart=True
)

#: Kind of store -> the bucket (container) names it takes, and their rule in words.
_BUCKETS = {
    "s3": (
        re.compile(r"(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
        "3 to 63 lowercase letters, digits, dots and hyphens, starting and "
        "ending with a letter or digit",
    ),
    "gcs": (  # up to 222 characters with dots, 63 between two
        re.compile(r"(?!.*[^.]{64})[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
        "3 to 63 lowercase letters, digits, dots, hyphens and underscores, "
        "starting and ending with a letter or digit",
    ),
    "azure": (
        re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]"),
        "3 to 63 lowercase letters, digits and single hyphens, starting "
        "and ending with a letter or digit",
    ),
}
#: Names of settings whose values are secret (environment and options).
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|SAS|KEY|CREDENTIAL", re.IGNORECASE)
_SECRET_PATTERNS = (
    re.compile(r"(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"']+", re.I),
    re.compile(r"(Signature=)[0-9a-fA-F]+"),
    re.compile(r"((?:^|[?&])sig=)[^&\s\"']+"),
    re.compile(r"(AccountKey=)[^;\s\"']+"),
    re.compile(r"(Authorization:?\s*)\S+(?:\s+\S+)?", re.I),
)

T = TypeVar("T")


def parse_url(url: str) -> tuple[str, str, str, str]:
    """Split an object-store URL into ``(scheme, bucket, account, prefix)``.

    ``account`` is the Azure account of an ``abfs://container@account...``
    URL, else ``""``.

    Raises
    ------
    ConfigError
        In one line naming the URL: a control character, an unknown scheme,
        no bucket, a bucket name the store refuses, credentials in the URL, a
        query, or a prefix with empty, ``.`` or ``..`` parts.
    """
    if any(not c.isprintable() for c in url):
        raise ConfigError(
            f"{shown(url)}: an object-store URL holds no control character "
            "(a newline, a tab, an escape)"
        )
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise ConfigError(
            f"{url}: unknown scheme {scheme or '(none)'!r} (known: {known})"
        )
    kind = SCHEMES[scheme]
    if "@" in rest and (scheme == "az" or kind != "azure"):
        host = rest.rpartition("@")[2].split("/")[0]
        raise ConfigError(
            f"{scheme}://***@{host}: credentials do not belong in the URL; give "
            "them through the environment or a profile"
        )
    parts = urlsplit(f"{scheme}://{rest}")
    netloc, account = parts.netloc, ""
    if kind == "azure" and "@" in netloc:
        netloc, _, host = netloc.partition("@")
        account = host.split(".")[0]
    elif ":" in netloc:
        raise ConfigError(
            f"{url}: a port does not belong in the URL; give the endpoint "
            "through AWS_ENDPOINT_URL or the storage's options"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{url}: an object-store URL has no query or fragment")
    word = "container" if kind == "azure" else "bucket"
    if not netloc:
        raise ConfigError(
            f"{url} names no {word}: write {scheme}://{word.upper()}/PREFIX"
        )
    names, rule = _BUCKETS[kind]
    if not names.fullmatch(netloc) or (kind == "s3" and aws.is_ip(netloc)):
        raise ConfigError(f"{url}: {netloc!r} is not a valid {word} name ({rule})")
    prefix = parts.path.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise ConfigError(f"{url}: the prefix {prefix!r} has empty, '.' or '..' parts")
    return scheme, netloc, account, prefix


#: Whether obstore's I/O runtime may have started in this process, and whether
#: this process is a child forked after that: the runtime's threads are not in
#: the child, and its event queue is the parent's own, so a request from the
#: child would hang, or break the parent's requests (``storage/forks.py``).
_RUNTIME = {"used": False, "forked": False}


@in_child
def _forked() -> None:
    if _RUNTIME["used"]:
        _RUNTIME["forked"] = True


def _check_runtime() -> None:
    """Refuse object storage in a child forked after its parent used it."""
    if _RUNTIME["forked"]:
        raise ForkedError(
            "object storage cannot be used in a process forked from one that "
            "already used it (its I/O runtime does not survive a fork): start "
            "this process with multiprocessing's 'forkserver' or 'spawn' method"
        )


def _import_obstore():
    try:
        import obstore
        import obstore.exceptions
        import obstore.store
    except ImportError:
        raise ConfigError(
            "object storage needs obstore: pip install 'dp-ckpt-plugin[s3]'"
        ) from None
    return obstore


class CloudStorage:
    """Objects in an S3 bucket, a GCS bucket or an Azure container.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
        or ``abfs[s]://container@account.dfs.core.windows.net/prefix``.
    **options
        Settings of obstore's store (``region``, ``endpoint``,
        ``access_key_id``, ...; S3 also takes ``profile``), and
        ``client_options`` / ``retry_config`` overriding this module's.

    Raises
    ------
    ConfigError
        For a bad URL, a profile that cannot be read, or no obstore.
    StorageUnavailableError
        When no credentials can be found at all (S3, with the instance
        metadata service turned off by ``AWS_EC2_METADATA_DISABLED``).
    """

    def __init__(self, url: str, **options: object) -> None:
        scheme, bucket, account, prefix = parse_url(url)
        self.kind = SCHEMES[scheme]
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"{scheme}://{url.split('://', 1)[1].split('/', 1)[0]}" + (
            f"/{prefix}" if prefix else ""
        )
        self.capabilities = CAPABILITIES
        #: Calls made, by primitive (``put``, ``head``, ...), and ``requests``:
        #: the HTTP requests they took (not counting obstore's retries).
        self.counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        _check_runtime()
        _RUNTIME["used"] = True
        self._obstore = _import_obstore()
        environ = dict(os.environ)
        self._secrets = _secret_values(options, environ)
        self.settings: aws.AwsSettings | None = None
        self._uploads: aws.MultipartUploads | None = None
        if self.kind == "s3":
            self.settings = aws.resolve(options, environ)
            self._secrets += self.settings.secrets()
            self._check_credentials(environ)
        self._store = self._open(options, environ, account)

    def __repr__(self) -> str:
        return f"CloudStorage({self.url!r})"

    # -- making the store -------------------------------------------------------
    def _check_credentials(self, environ: Mapping[str, str]) -> None:
        """No credentials anywhere in the chain: one line now, before any request."""
        if self.settings.signed or aws.truthy(environ.get("AWS_SKIP_SIGNATURE")):
            return  # signed, or anonymous requests asked for
        metadata = not aws.truthy(environ.get("AWS_EC2_METADATA_DISABLED"))
        said = _NO_METADATA if metadata else _NO_CREDENTIALS
        raise StorageUnavailableError(self.url, "reach", said)

    def _open(self, options: dict, environ: Mapping[str, str], account: str):
        store_module = self._obstore.store
        options = dict(options)
        client = {
            "connect_timeout": dt.timedelta(seconds=CONNECT_TIMEOUT),
            "timeout": dt.timedelta(seconds=REQUEST_TIMEOUT),
            **(options.pop("client_options", None) or {}),
        }
        retry = {
            "max_retries": RETRIES,
            "retry_timeout": dt.timedelta(seconds=RETRY_TIMEOUT),
            "backoff": {
                "init_backoff": dt.timedelta(seconds=FIRST_BACKOFF),
                "max_backoff": dt.timedelta(seconds=MAX_BACKOFF),
                "base": 2,
            },
            **(options.pop("retry_config", None) or {}),
        }
        try:
            if self.kind == "s3":
                store, options = store_module.S3Store, self._s3_options(options, client)
            else:
                self._other_options(options, client, environ, account)
                gcs = self.kind == "gcs"
                store = store_module.GCSStore if gcs else store_module.AzureStore
            return store(
                self.bucket,
                prefix=self.prefix or None,
                client_options=client,
                retry_config=retry,
                **options,
            )
        except (ValueError, TypeError, self._obstore.exceptions.BaseError) as exc:
            raise ConfigError(f"{self.url}: {self._cause(exc)}") from None

    def _s3_options(self, options: dict, client: dict) -> dict:
        """obstore's S3 options: the resolved settings (:mod:`.aws`), and the rest."""
        settings = self.settings
        config = {k: v for k, v in options.items() if k not in _RESOLVED}
        config["region"] = settings.region
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
            if settings.endpoint.startswith("http://"):
                client.setdefault("allow_http", True)
        if settings.static:
            config["access_key_id"] = settings.access_key_id
            config["secret_access_key"] = settings.secret_access_key
            if settings.session_token:
                config["session_token"] = settings.session_token
        # else botocore's chain, renewed by obstore (or anonymous: none)
        config["credential_provider"] = settings.provider
        return config

    def _other_options(self, options: dict, client: dict, environ, account: str):
        """Complete the options of a GCS or Azure store (in place)."""
        endpoints = [
            str(v)
            for k, v in [*options.items(), *environ.items()]
            if re.search(r"URL|ENDPOINT", k, re.I) and isinstance(v, str)
        ]
        if any(e.startswith("http://") for e in endpoints):
            client.setdefault("allow_http", True)
        if self.kind != "azure":
            return
        if account:
            options.setdefault("account_name", account)
        if not (
            options.get("account_name") or environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        ):
            raise ConfigError(
                f"{self.url}: no Azure storage account: set "
                "AZURE_STORAGE_ACCOUNT_NAME, or write "
                f"abfss://{self.bucket}@ACCOUNT.dfs.core.windows.net/..."
            )

    # -- plumbing ---------------------------------------------------------------
    def url_of(self, key: str) -> str:
        """The URL of the object at ``key``."""
        return f"{self.url}/{check_key(key)}"

    def _count(self, op: str, requests: int = 1) -> None:
        _check_runtime()  # every call of obstore's is counted first
        with self._count_lock:
            self.counts[op] += 1
            self.counts["requests"] += requests

    def _scrub(self, text: str) -> str:
        text = scrub_url(text)
        for secret in sorted(self._secrets, key=len, reverse=True):
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub(r"\1***", text)
        return text

    def _cause(self, exc: BaseException) -> str:
        """What went wrong, in one line, with no secret in it."""
        return describe(exc, self._scrub, self.bucket)

    def _named(self, key: str | None) -> str:
        """The URL an error names: of ``key`` (unchecked), else the storage's."""
        return self.url if key is None else f"{self.url}/{key}"

    def _fail(self, what: str, key: str | None, exc: BaseException) -> Exception:
        return StorageUnavailableError(self._named(key), what, self._cause(exc))

    def _run(self, what: str, key: str | None, call: Callable[[], T]) -> T:
        """``call()``, any error of obstore's turned into one clear error."""
        errors = self._obstore.exceptions
        try:
            return call()
        except (errors.BaseError, OSError, ValueError, RuntimeError) as exc:
            if isinstance(exc, (KeyExistsError, VersionMismatchError, KeyMissingError)):
                raise
            raise self._fail(what, key, exc) from None

    def _version(self, found: Mapping) -> str:
        if self.kind == "gcs" and found.get("version"):
            return str(found["version"])
        return str(found.get("e_tag") or found.get("version") or "")

    def _info(self, key: str, meta: Mapping) -> ObjectInfo:
        modified = meta.get("last_modified")
        when = modified.timestamp() if isinstance(modified, dt.datetime) else 0.0
        return ObjectInfo(key, int(meta["size"]), self._version(meta), when)

    # -- the protocol -------------------------------------------------------------
    def put(self, key: str, data: Source) -> ObjectInfo:
        """Write a whole object, replacing any (multipart above :data:`PART_SIZE`).

        An open file is streamed: at most :data:`PART_CONCURRENCY` parts are
        in memory at a time.
        """
        check_key(key)
        size, source = _prepare(data)
        parts = -(-size // PART_SIZE) if size > PART_SIZE else 0
        self._count("put", parts + 2 if parts else 1)
        put = self._obstore.put
        chunks = {"chunk_size": PART_SIZE, "max_concurrency": PART_CONCURRENCY}
        found = self._run("write", key, lambda: put(self._store, key, source, **chunks))
        return ObjectInfo(key, size, self._version(found), time.time())

    def _conditional(self, op: str, what: str, key: str, data: bytes, mode):
        check_key(key)
        payload = bytes(data)
        self._count(op)
        errors = self._obstore.exceptions
        put = self._obstore.put
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                found = put(self._store, key, payload, mode=mode, use_multipart=False)
            except (errors.BaseError, OSError, ValueError, RuntimeError) as exc:
                conflict = "409 Conflict" in str(exc)
                if conflict and attempt < CONFLICT_RETRIES:
                    # a concurrent conditional write was in flight: S3 says
                    # to send it again (obstore words it as the condition)
                    self._count("requests", 0)
                    time.sleep(FIRST_BACKOFF * 2**attempt)
                    continue
                if conflict:
                    raise self._fail(what, key, exc) from None
                if isinstance(exc, errors.AlreadyExistsError):
                    raise KeyExistsError(self.url_of(key)) from None
                if op == "put_if_match" and isinstance(
                    exc, (errors.PreconditionError, FileNotFoundError)
                ):
                    raise VersionMismatchError(self.url_of(key)) from None
                raise self._fail(what, key, exc) from None
            return ObjectInfo(key, len(payload), self._version(found), time.time())

    def put_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        """Create an object; :class:`KeyExistsError` if one is there."""
        return self._conditional("put_if_absent", "create", key, data, "create")

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace an object still at ``version``; :class:`VersionMismatchError` if not."""
        mode = {"version": version} if self.kind == "gcs" else {"e_tag": version}
        return self._conditional("put_if_match", "replace", key, data, mode)

    def get(
        self, key: str, limit: int = SMALL_OBJECT_LIMIT
    ) -> tuple[bytes, ObjectInfo] | None:
        """A small object and its version; ``None`` when absent.

        The size is read from the answer's headers first: the body of an
        object larger than ``limit`` is not read.
        """
        check_key(key)
        self._count("get")
        get = self._obstore.get

        def call():
            try:
                found = get(self._store, key)
            except FileNotFoundError:
                return None
            info = self._info(key, found.meta)
            if info.size > limit:
                return info
            return bytes(found.bytes()), info

        found = self._run("read", key, call)
        if isinstance(found, ObjectInfo):
            raise ObjectTooLargeError(self.url_of(key), found.size, limit)
        return found

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of an object (fewer at its end)."""
        check_key(key)
        if start < 0 or end < start:
            raise ValueError(f"not a byte range: {start} to {end}")
        self._count("get_range")
        get_range = self._obstore.get_range

        def call():
            if end > start:
                try:
                    return bytes(get_range(self._store, key, start=start, end=end))
                except FileNotFoundError:
                    raise KeyMissingError(self.url_of(key)) from None
                except (ValueError, self._obstore.exceptions.BaseError) as exc:
                    if "range" not in str(exc).lower() and "416" not in str(exc):
                        raise
            # an empty range, or one past the end: the object must still be there
            self._count("requests", 0)
            if self._head(key) is None:
                raise KeyMissingError(self.url_of(key))
            return b""

        return self._run("read", key, call)

    def download(self, key: str, sink: BinaryIO) -> ObjectInfo:
        """Stream an object into ``sink``; return what it was.

        Read in ranges of :data:`DOWNLOAD_PART` bytes, each of the version
        first seen: an object replaced meanwhile raises
        :class:`VersionMismatchError` (the sink then holds a part of it).
        """
        check_key(key)
        errors = self._obstore.exceptions
        get = self._obstore.get

        def call():
            info = self._head(key)
            if info is None:
                raise KeyMissingError(self.url_of(key))
            self._count("requests", -(-info.size // DOWNLOAD_PART))
            generation = self.kind == "gcs" and info.version.isdigit()
            same = "version" if generation else "if_match"
            for start in range(0, info.size, DOWNLOAD_PART):
                end = min(start + DOWNLOAD_PART, info.size)
                options = {"range": (start, end), same: info.version}
                try:
                    found = get(self._store, key, options=options)
                except (errors.PreconditionError, FileNotFoundError):
                    raise VersionMismatchError(self.url_of(key)) from None
                for chunk in found.stream(min_chunk_size=STREAM_CHUNK):
                    sink.write(chunk)
            return info

        self._count("download", 0)
        return self._run("read", key, call)

    def _head(self, key: str) -> ObjectInfo | None:
        try:
            return self._info(key, self._obstore.head(self._store, key))
        except FileNotFoundError:
            return None

    def head(self, key: str) -> ObjectInfo | None:
        """What the object at ``key`` is, or ``None``."""
        check_key(key)
        self._count("head")
        return self._run("look up", key, lambda: self._head(key))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """The objects whose keys start with ``prefix`` (any string), by key."""
        check_prefix(prefix)
        folder = prefix.rpartition("/")[0]
        self._count("list", 0)
        listing = self._obstore.list

        def call():
            found = []
            for chunk in listing(self._store, folder or None, chunk_size=1000):
                self._count("requests", 0)
                found += [
                    self._info(meta["path"], meta)
                    for meta in chunk
                    if meta["path"].startswith(prefix)
                ]
            return found

        found = self._listing(prefix, None, call)
        return iter(sorted(found, key=lambda info: info.key))

    def _listing(self, prefix: str, delimiter: str | None, call: Callable[[], list]):
        """``call()``, obstore's listing; where obstore refused a key it cannot
        parse, botocore's (see :mod:`.aws`): the objects, or with ``delimiter``
        the folders, their keys relative to the root."""
        named = f"{prefix}*" if prefix else None
        try:
            return self._run("list", named, call)
        except StorageUnavailableError as exc:
            if not (self.aborts_uploads and "invalid path" in exc.cause.lower()):
                raise
        base = self._base
        self._count("list")
        with self._botocore(named, "list"):
            found, folders = self._multipart().objects(base + prefix, delimiter)
        if delimiter:
            return [f[len(base) :] for f in folders]
        return [replace(info, key=info.key[len(base) :]) for info in found]

    @property
    def _base(self) -> str:
        """The prefix's folder in the bucket (``""`` at its root)."""
        return f"{self.prefix}/" if self.prefix else ""

    @contextlib.contextmanager
    def _botocore(self, key: str | None, what: str) -> Iterator[None]:
        """A call of :mod:`.aws`, its error turned into one clear error."""
        try:
            yield
        except (aws.S3RequestError, OSError, ValueError) as exc:
            cause = self._scrub(str(exc).splitlines()[0])
            raise StorageUnavailableError(self._named(key), what, cause) from None

    def delete(self, key: str) -> bool:
        """Remove an object; ``False`` if it was not there."""
        check_key(key)
        self._count("delete", 2)
        delete = self._obstore.delete

        def call():
            if self._head(key) is None:
                return False
            try:
                delete(self._store, key)
            except FileNotFoundError:
                return False
            return True

        return self._run("delete", key, call)

    # -- beyond the protocol --------------------------------------------------------
    def check(self) -> None:
        """Reach the bucket once (one listing of at most one object).

        Raises
        ------
        StorageUnavailableError
            In one line: the bucket does not exist, the credentials are
            refused or missing, the endpoint does not answer.
        """
        self._count("check")
        listing = self._obstore.list
        self._run(
            "reach",
            None,
            lambda: next(iter(listing(self._store, None, chunk_size=1)), None),
        )

    @property
    def aborts_uploads(self) -> bool:
        """Whether :meth:`abort_incomplete_uploads` can run here (S3, signed requests)."""
        return self.kind == "s3" and self.settings is not None and self.settings.signed

    def folders(self, prefix: str) -> list[str]:
        """The folder names directly under ``prefix`` (``""`` or ending in ``/``)."""
        check_prefix(prefix)
        self._count("list")
        listing = self._obstore.list_with_delimiter

        def call():
            return listing(self._store, prefix.rstrip("/") or None)["common_prefixes"]

        folders = self._listing(prefix, "/", call)
        return sorted({p.rstrip("/").rpartition("/")[2] for p in folders})

    def _multipart(self):
        if self._uploads is None:  # botocore's client, made once
            self._uploads = aws.MultipartUploads(self.settings, self.bucket)
        return self._uploads

    def incomplete_uploads(
        self, prefix: str, *, page: int = 1000
    ) -> tuple[list[PendingUpload], float]:
        """The incomplete uploads whose keys start with ``prefix``, and the server's time.

        Keys are relative to the storage's root; uploads of other prefixes of
        the bucket are never answered.
        """
        what = "list the incomplete uploads under"
        if not self.aborts_uploads:
            raise StorageUnavailableError(self.url, what, _NO_UPLOADS)
        self._count("list_uploads")
        base = self._base
        with self._botocore(None, what):
            found, now = self._multipart().list(base + prefix, page)
        ours = [u for u in found if u.key.startswith(base + prefix)]
        return [replace(u, key=u.key[len(base) :]) for u in ours], now

    def abort_upload(self, upload: PendingUpload) -> bool:
        """Abort one incomplete upload; ``False`` if it was gone already."""
        self._count("abort_upload")
        with self._botocore(upload.key, "abort the upload"):
            return self._multipart().abort(replace(upload, key=self._base + upload.key))

    def abort_incomplete_uploads(
        self, prefix: str, older_than_seconds: float, *, page: int = 1000
    ) -> int:
        """Abort the multipart uploads under ``prefix`` begun that long ago or more.

        A writer killed during a multipart upload leaves its parts stored,
        and billed, but invisible to ``list``. Ages are measured by the
        server's clock (its ``Date`` against each upload's ``Initiated``).

        ``page`` is how many uploads one listing request asks for.

        Returns
        -------
        int
            How many uploads were aborted.

        Raises
        ------
        StorageUnavailableError
            When the storage cannot do it (not S3, or credentials left to
            obstore's chain), or the requests fail.
        """
        if not self.aborts_uploads:
            raise StorageUnavailableError(
                self.url, "abort the incomplete uploads under", _NO_UPLOADS
            )
        self._count("abort_incomplete_uploads", 0)
        found, now = self.incomplete_uploads(prefix, page=page)
        return sum(
            self.abort_upload(u)
            for u in found
            if now - u.initiated >= older_than_seconds
        )


#: The options :func:`.aws.resolve` reads (obstore is given what it resolved).
_RESOLVED = {"profile", "region", "endpoint", "aws_endpoint_url_s3", "token"}
_RESOLVED |= {"access_key_id", "secret_access_key", "session_token"}
_NO_UPLOADS = (
    "only S3 storage with credentials can list them; set a lifecycle rule on the "
    "bucket instead"
)
_NO_CREDENTIALS = (
    "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
    "AWS_PROFILE with a profile in ~/.aws/credentials or ~/.aws/config (keys, "
    "a role, SSO or a credential_process)"
)
_NO_METADATA = (
    f"{_NO_CREDENTIALS} (none in the environment or the profile files, and the "
    "instance metadata service did not answer)"
)


def _secret_values(options: Mapping[str, object], environ: Mapping[str, str]):
    return tuple(
        value
        for name, value in [*options.items(), *environ.items()]
        if isinstance(value, str) and len(value) >= 8 and _SECRET_NAME.search(name)
    )


def _prepare(data: Source) -> tuple[int, object]:
    """The size of a source (bytes, a buffer, an open file) and what obstore is handed."""
    if isinstance(data, (bytes, bytearray)):
        return len(data), data
    if isinstance(data, memoryview):
        view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
        return view.nbytes, view
    position = data.tell()
    end = data.seek(0, os.SEEK_END)
    data.seek(position)
    return end - position, data


_PERFORMING = re.compile(r"Error performing (\w+) ([a-z][a-z0-9+.-]*://\S+)")
_STATUS = re.compile(r"status code: (\d{3})( [A-Za-z][A-Za-z ]*[a-z])?")
_CODE = re.compile(r"<Code>([^<]+)</Code>(?:\s*<Message>([^<]*)</Message>)?")
_RETRIES = re.compile(r"after (\d+) retries")
_ELAPSED = re.compile(r" in ([\d.]+)(µs|ms|s)\b")


def describe(exc: BaseException, scrub: Callable[[str], str], bucket: str) -> str:
    """The cause of an obstore error in one short line (scrubbed by ``scrub``).

    ``no answer from http://host:port (error sending request, after 3
    retries in 1.4 s)``, ``the server answered 503 Service Unavailable
    (SlowDown: Please reduce your request rate; after 3 retries)``,
    ``the bucket b does not exist``, ``access denied (AccessDenied: ...)``.
    """
    flat = " ".join(scrub(str(exc).split("Debug source:")[0]).split())
    code = _CODE.search(flat)
    status = _STATUS.search(flat)
    retried = _RETRIES.search(flat)
    elapsed = _ELAPSED.search(flat)
    after = ""
    if retried and int(retried.group(1)):
        after = f"after {retried.group(1)} retries"
        if elapsed:
            value, unit = float(elapsed.group(1)), elapsed.group(2)
            seconds = value / {"µs": 1e6, "ms": 1e3, "s": 1.0}[unit]
            after += f" in {seconds:.1f} s"
    if code and code.group(1) == "NoSuchBucket":
        return f"the bucket {bucket} does not exist"
    performing = _PERFORMING.search(flat)
    target = performing.group(2) if performing else ""
    if "/latest/api/token" in target or "/latest/meta-data" in target:
        return _NO_METADATA
    if status:
        said = f"{status.group(1)}{status.group(2) or ''}"
        coded = f"{code.group(1)}: {code.group(2)}" if code and code.group(2) else ""
        inner = "; ".join(d for d in (coded, after) if d)
        denied = "access denied, " if status.group(1) in ("401", "403") else ""
        return f"{denied}the server answered {said}" + (f" ({inner})" if inner else "")
    sending = "sending request" in flat
    if performing and (sending or "connect" in flat.lower()):
        split = urlsplit(target)
        where = f"{split.scheme}://{split.netloc}" if split.netloc else target
        reason = "error sending request" if sending else "connection failed"
        return f"no answer from {where} ({reason}" + (f", {after})" if after else ")")
    if "builder error" in flat:
        return f"the request could not be built ({flat[:200]})"
    first = flat.removeprefix("Generic S3 error: ").removeprefix("Generic error: ")
    return first[:300] or type(exc).__name__
