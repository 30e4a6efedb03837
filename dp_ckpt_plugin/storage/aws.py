"""S3 settings taken the way AWS tools take them, and the S3 calls obstore lacks.

:func:`resolve` finds the region, the endpoint and the credentials of an S3
storage in the order the AWS command line and SDKs use:

- credentials: the storage's options (``access_key_id``, ``secret_access_key``,
  ``session_token``; a ``profile`` option reads that profile instead), then
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, then
  the profile named by ``AWS_PROFILE`` (or ``default``) in
  ``~/.aws/credentials`` and ``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``,
  ``AWS_CONFIG_FILE``); with none of these, obstore's own chain (web identity,
  container credentials, the instance metadata service) is left to find them;
- region: the ``region`` option, ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the
  profile's ``region``, else ``us-east-1``;
- endpoint: the ``endpoint`` option, ``AWS_ENDPOINT_URL_S3``,
  ``AWS_ENDPOINT_URL``, the profile's ``endpoint_url``, else AWS's own.

obstore reads the environment variables itself but not the profile files,
and refuses an ``http://`` endpoint unless told to allow it; the storage
hands it what was resolved here, so both agree.

:class:`MultipartUploads` lists and aborts the incomplete multipart uploads a
killed writer leaves (``ListMultipartUploads``, ``AbortMultipartUpload``):
two plain HTTP requests signed with AWS Signature Version 4 by
:func:`sign_v4`, with the same resolved credentials and endpoint.

Nothing here logs or words a secret: :meth:`AwsSettings.secrets` lists what a
message must never hold, and the settings' ``repr`` shows none of it.
"""

from __future__ import annotations

import configparser
import datetime as dt
import hashlib
import hmac
import http.client
import ipaddress
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..errors import ConfigError
from ..text import scrub_url, shown

#: The SHA-256 of an empty request body.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: The region when nothing names one (as AWS's tools assume).
DEFAULT_REGION = "us-east-1"
#: Seconds to wait for a connection and for each answer of a signed request.
REQUEST_TIMEOUT = 10.0
#: Attempts of a signed request that meets a transient error (5xx, refused).
REQUEST_ATTEMPTS = 4
#: First pause between attempts, doubled each time.
FIRST_BACKOFF = 0.1
#: Profile keys that mean "credentials come from elsewhere", not read here.
_INDIRECT_KEYS = (
    "role_arn",
    "credential_process",
    "sso_start_url",
    "sso_session",
    "web_identity_token_file",
)


@dataclass(frozen=True)
class AwsSettings:
    """Where an S3 storage goes and how it signs.

    Attributes
    ----------
    region : str
    endpoint : str or None
        A custom endpoint (``http://127.0.0.1:9000``), or ``None`` for AWS's.
    access_key_id, secret_access_key, session_token : str or None
        Static credentials, or ``None`` when obstore's chain finds them.
    source : str
        Where the credentials came from (``options``, ``environment``,
        ``profile dev``), or ``""``.
    virtual_hosted : bool
        Whether the bucket is in the host name rather than the path.
    """

    region: str
    endpoint: str | None
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    source: str
    virtual_hosted: bool = False

    def __repr__(self) -> str:
        endpoint = scrub_url(self.endpoint) if self.endpoint else None
        return (
            f"AwsSettings(region={self.region!r}, endpoint={endpoint!r}, "
            f"credentials from {self.source or 'the provider chain'})"
        )

    @property
    def static(self) -> bool:
        """Whether the credentials are known here (not left to obstore)."""
        return bool(self.access_key_id and self.secret_access_key)

    def secrets(self) -> tuple[str, ...]:
        """The values no message may hold."""
        found = (self.secret_access_key, self.session_token, self.access_key_id)
        return tuple(s for s in found if s)

    def bucket_url(self, bucket: str) -> str:
        """The URL of the bucket, without a trailing ``/``."""
        if self.endpoint:
            base = self.endpoint.rstrip("/")
            return base if self.virtual_hosted else f"{base}/{bucket}"
        if self.virtual_hosted:
            return f"https://{bucket}.s3.{self.region}.amazonaws.com"
        return f"https://s3.{self.region}.amazonaws.com/{bucket}"


def _first(*values: str | None) -> str | None:
    return next((v for v in values if v), None)


def _named(*pairs: tuple[str, str | None]) -> tuple[str, str | None]:
    """The first ``(name, value)`` whose value is set, else ``("", None)``."""
    return next(((n, v) for n, v in pairs if v), ("", None))


_REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def check_region(name: str, value: str | None) -> str:
    """``value``, a region; :class:`ConfigError` naming ``name`` if it is not one."""
    if value is None or not _REGION.fullmatch(value):
        raise ConfigError(
            f"{name} is {shown(value)!r}: not an AWS region (letters, digits, "
            "'-', '_' and '.', such as us-east-1)"
        )
    return value


def check_endpoint(name: str, value: str | None) -> str | None:
    """``value``, an endpoint URL or ``None``; :class:`ConfigError` naming ``name``.

    Checked before any client is built (a client given a malformed one
    panics at its first request): ``http://`` or ``https://``, a host, a
    port from 1 to 65535 if any, no space or control character, no query.
    """
    if value is None:
        return None
    said = scrub_url(value)
    if "@" in said:  # what comes before it may be a password, URL or not
        scheme, sep, rest = said.rpartition("://")
        said = f"{scheme}{sep}***@{rest.rpartition('@')[2]}"
    said = shown(said)

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{name} is {said!r}: {why}")

    if any(c.isspace() or not c.isprintable() for c in value):
        raise refuse("an endpoint URL holds no space or control character")
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise refuse(f"not a URL ({exc})") from None
    try:
        port = parts.port
    except ValueError:
        raise refuse("the port must be a number from 1 to 65535") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise refuse(
            "an endpoint URL starts with http:// or https:// "
            "(such as http://127.0.0.1:9000)"
        )
    if not parts.hostname:
        raise refuse("the endpoint URL names no host")
    if not (_HOST.fullmatch(parts.hostname) or _ip(parts.hostname)):
        raise refuse(f"{shown(parts.hostname)!r} is not a host name")
    if port == 0:
        raise refuse("the port must be a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise refuse("an endpoint URL has no query or fragment")
    return value


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def resolve(options: Mapping[str, object], environ: Mapping[str, str]) -> AwsSettings:
    """The region, endpoint and credentials of an S3 storage (see the module docs).

    Raises
    ------
    ConfigError
        When a profile named explicitly is not in the files, or cannot give
        static keys, or a file cannot be read.
    """
    explicit = options.get("profile")
    name = str(explicit or environ.get("AWS_PROFILE") or "default")
    profile = read_profile(
        name, environ, required=bool(explicit or "AWS_PROFILE" in environ)
    )
    opt = {k: (str(v) if v is not None else None) for k, v in options.items()}
    region = check_region(
        *_named(
            ("the option region", opt.get("region")),
            ("AWS_REGION", environ.get("AWS_REGION")),
            ("AWS_DEFAULT_REGION", environ.get("AWS_DEFAULT_REGION")),
            (f"the region of AWS profile {name!r}", profile.get("region")),
            ("the default region", DEFAULT_REGION),
        )
    )
    endpoint = check_endpoint(
        *_named(
            ("the option endpoint", opt.get("endpoint")),
            ("the option aws_endpoint_url_s3", opt.get("aws_endpoint_url_s3")),
            ("AWS_ENDPOINT_URL_S3", environ.get("AWS_ENDPOINT_URL_S3")),
            ("AWS_ENDPOINT_URL", environ.get("AWS_ENDPOINT_URL")),
            ("AWS_ENDPOINT", environ.get("AWS_ENDPOINT")),
            (f"the endpoint_url of AWS profile {name!r}", profile.get("endpoint_url")),
        )
    )
    env_keys = (environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY"))
    if opt.get("access_key_id") and opt.get("secret_access_key"):
        key, secret = opt["access_key_id"], opt["secret_access_key"]
        token, source = opt.get("session_token") or opt.get("token"), "options"
    elif all(env_keys) and not explicit:
        key, secret = env_keys
        token = _first(
            environ.get("AWS_SESSION_TOKEN"), environ.get("AWS_SECURITY_TOKEN")
        )
        source = "environment"
    elif profile.get("aws_access_key_id") and profile.get("aws_secret_access_key"):
        key, secret = profile["aws_access_key_id"], profile["aws_secret_access_key"]
        token, source = profile.get("aws_session_token"), f"profile {name}"
    else:
        indirect = [k for k in _INDIRECT_KEYS if k in profile]
        if indirect and (explicit or "AWS_PROFILE" in environ):
            raise ConfigError(
                f"AWS profile {name!r} gets its keys through {indirect[0]}, which "
                "is not read here: export AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (for example from `aws configure "
                "export-credentials`)"
            )
        key = secret = token = None
        source = ""
    virtual = opt.get("virtual_hosted_style_request") or environ.get(
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"
    )
    return AwsSettings(region, endpoint, key, secret, token, source, _truthy(virtual))


def read_profile(
    name: str, environ: Mapping[str, str], *, required: bool
) -> dict[str, str]:
    """The keys of profile ``name`` from the credentials and config files.

    The credentials file's section wins over the config file's for a key in
    both. A profile that is in neither is an empty dict, or a
    :class:`ConfigError` when ``required`` (it was named explicitly).
    """
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    files = (
        (Path(environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config"), "config"),
        (
            Path(
                environ.get("AWS_SHARED_CREDENTIALS_FILE")
                or home / ".aws" / "credentials"
            ),
            "credentials",
        ),
    )
    found: dict[str, str] = {}
    seen = False
    for path, kind in files:
        parser = _read_ini(path)
        if parser is None:
            continue
        section = (
            name if kind == "credentials" or name == "default" else f"profile {name}"
        )
        if parser.has_section(section):
            seen = True
            found.update({k: v.strip() for k, v in parser.items(section, raw=True)})
    if required and not seen:
        raise ConfigError(
            f"AWS profile {name!r} is in neither {files[1][0]} nor {files[0][0]}"
        )
    return found


def _read_ini(path: Path) -> configparser.ConfigParser | None:
    parser = configparser.ConfigParser(interpolation=None, default_section="\0")
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"could not read the AWS file {path}: {first}") from None
    return parser


# -- AWS Signature Version 4 ------------------------------------------------------


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def _encode(text: str, safe: str = "") -> str:
    """URI-encode as SigV4 does: everything but ``A-Za-z0-9-._~`` (and ``safe``)."""
    return quote(text, safe="~" + safe)


def canonical_query(params: Mapping[str, str]) -> str:
    """A query string in SigV4's canonical form (also what is sent)."""
    pairs = sorted((_encode(k), _encode(v)) for k, v in params.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


def sign_v4(
    method: str,
    url: str,
    settings: AwsSettings,
    *,
    now: dt.datetime | None = None,
    payload_sha256: str = EMPTY_SHA256,
    service: str = "s3",
) -> dict[str, str]:
    """The headers that sign a request to ``url`` with AWS Signature Version 4.

    ``url`` carries its path already encoded (as sent) and its query in
    :func:`canonical_query` form. Returns ``Host``, ``x-amz-date``,
    ``x-amz-content-sha256``, ``x-amz-security-token`` when there is a
    session token, and ``Authorization``.
    """
    if not settings.static:
        raise ValueError("signing needs static credentials")
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    parts = urlsplit(url)
    headers = {
        "host": parts.netloc,
        "x-amz-content-sha256": payload_sha256,
        "x-amz-date": stamp,
    }
    if settings.session_token:
        headers["x-amz-security-token"] = settings.session_token
    names = sorted(headers)
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            parts.query,
            "".join(f"{n}:{headers[n].strip()}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{day}/{settings.region}/{service}/aws4_request"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            scope,
            hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        ]
    )
    key = _hmac(("AWS4" + (settings.secret_access_key or "")).encode("utf-8"), day)
    for part in (settings.region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={settings.access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


# -- the multipart calls ----------------------------------------------------------


class S3RequestError(Exception):
    """A signed request failed; ``status`` is the HTTP status or ``None``."""

    def __init__(self, cause: str, status: int | None = None) -> None:
        super().__init__(cause)
        self.status = status


@dataclass(frozen=True)
class Upload:
    """An incomplete multipart upload: its key in the bucket, id and start time."""

    key: str
    upload_id: str
    initiated: float


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _child(node: ET.Element, name: str) -> str:
    for sub in node:
        if _local(sub.tag) == name:
            return sub.text or ""
    return ""


def _timestamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class MultipartUploads:
    """``ListMultipartUploads`` and ``AbortMultipartUpload`` on one bucket.

    Parameters
    ----------
    settings : AwsSettings
        Resolved settings with static credentials.
    bucket : str
    """

    def __init__(self, settings: AwsSettings, bucket: str) -> None:
        if not settings.static:
            raise ValueError("listing uploads needs static credentials")
        self.settings = settings
        self.bucket = bucket
        self.base = settings.bucket_url(bucket)

    def request(
        self, method: str, key: str, params: Mapping[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one signed request (retried on a transient error); return the answer."""
        base = urlsplit(self.base)
        path = f"{base.path}/{_encode(key, safe='/')}" if key else base.path or "/"
        target = f"{path}?{canonical_query(params)}" if params else path
        url = f"{base.scheme}://{base.netloc}{target}"
        kind = (
            http.client.HTTPSConnection
            if base.scheme == "https"
            else http.client.HTTPConnection
        )
        pause = FIRST_BACKOFF
        for attempt in range(REQUEST_ATTEMPTS):
            headers = sign_v4(method, url, self.settings)
            conn = kind(base.netloc, timeout=REQUEST_TIMEOUT)
            try:
                conn.request(method, target, headers=headers)
                answer = conn.getresponse()
                body = answer.read()
                status = answer.status
                found = {k.lower(): v for k, v in answer.getheaders()}
            except (OSError, http.client.HTTPException) as exc:
                cause = (
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
                status, found, body = None, {}, cause.encode()
            finally:
                conn.close()
            if status is not None and status < 500:
                return status, found, body
            if attempt + 1 == REQUEST_ATTEMPTS:
                if status is None:
                    raise S3RequestError(
                        f"no answer from {base.netloc} ({body.decode()}, "
                        f"after {REQUEST_ATTEMPTS} attempts)"
                    )
                raise S3RequestError(
                    f"{status} {_error_code(body)} after {REQUEST_ATTEMPTS} attempts",
                    status,
                )
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")

    def list(self, prefix: str, page: int = 1000) -> tuple[list[Upload], float]:
        """The incomplete uploads under ``prefix`` and the server's time now.

        ``page`` uploads are asked for at a time (S3 gives at most 1000).
        """
        found: list[Upload] = []
        first = {"uploads": "", "prefix": prefix, "max-uploads": str(page)}
        params = first
        server_now = time.time()
        while True:
            status, headers, body = self.request("GET", "", params)
            if status != 200:
                raise S3RequestError(
                    f"listing uploads answered {status} {_error_code(body)}", status
                )
            if "date" in headers:
                server_now = parsedate_to_datetime(headers["date"]).timestamp()
            try:
                root = ET.fromstring(body)
            except ET.ParseError as exc:
                raise S3RequestError(f"the upload listing is not XML: {exc}") from None
            for node in root:
                if _local(node.tag) == "Upload":
                    found.append(
                        Upload(
                            _child(node, "Key"),
                            _child(node, "UploadId"),
                            _timestamp(_child(node, "Initiated")),
                        )
                    )
            if _child(root, "IsTruncated").lower() != "true":
                return found, server_now
            params = {
                **first,
                "key-marker": _child(root, "NextKeyMarker"),
                "upload-id-marker": _child(root, "NextUploadIdMarker"),
            }

    def abort(self, upload: Upload) -> bool:
        """Abort one upload; ``False`` if it was already gone."""
        status, _, body = self.request(
            "DELETE", upload.key, {"uploadId": upload.upload_id}
        )
        if status in (200, 204):
            return True
        if status == 404:
            return False
        raise S3RequestError(
            f"aborting an upload answered {status} {_error_code(body)}", status
        )

    def uploads_older_than(
        self, prefix: str, seconds: float, page: int = 1000
    ) -> Iterator[Upload]:
        """The uploads under ``prefix`` begun ``seconds`` ago or more (server time)."""
        found, now = self.list(prefix, page)
        return (u for u in found if now - u.initiated >= seconds)


def _error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 error document, or ``""``."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return ""
    return _child(root, "Code") if _local(root.tag) == "Error" else ""
