"""S3 settings taken the way AWS tools take them, through botocore; the two
multipart calls obstore lacks, through botocore's S3 client.

:func:`resolve` finds the region, the endpoint and the credentials of an S3
storage. The credentials come from botocore's own chain for the profile
(the ``profile`` option, else ``AWS_PROFILE``, else ``default``): the
environment's keys (unless a profile was named in the options), the shared
credentials and config files with everything they may say (static keys,
assumed roles, SSO, ``credential_process``, web identity), the container's
and the instance's credentials; the storage's own ``access_key_id`` and
``secret_access_key`` options come first. Keys that expire are renewed by
obstore through :class:`obstore.auth.boto3.Boto3CredentialProvider`.

The region and the endpoint are taken in the order AWS's tools use, and
checked here, before any client is built, so a malformed one is one line
naming where it came from (a client given a malformed endpoint panics at its
first request):

- region: the ``region`` option, ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the
  profile's ``region``, else ``us-east-1``;
- endpoint: the ``endpoint`` option, ``AWS_ENDPOINT_URL_S3``,
  ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT``, the profile's ``endpoint_url``,
  else AWS's own.

Written here by hand, because no library does it for us: only that order
with its checks, and the one-line wording of what fails.

:class:`MultipartUploads` lists and aborts the incomplete multipart uploads a
killed writer leaves (``ListMultipartUploads``, ``AbortMultipartUpload``)
with botocore's S3 client, on the same session, endpoint and credentials,
and lists the keys obstore refuses to parse (``a//b``, ``a/../b``, a
trailing ``/``), which anyone may put under a store's prefix.

Nothing here logs or words a secret: :meth:`AwsSettings.secrets` lists what a
message must never hold, and the settings' ``repr`` shows none of it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..storage.objects import ObjectInfo, PendingUpload
from ..text import scrub_url, shown

#: The region when nothing names one (as AWS's tools assume).
DEFAULT_REGION = "us-east-1"
#: Seconds to wait for a connection and for each answer of a multipart call.
REQUEST_TIMEOUT = 10.0
#: Attempts of a multipart call that meets a transient error (5xx, refused).
REQUEST_ATTEMPTS = 4

_REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
#: How botocore names where credentials came from -> how a line says it.
_METHODS = {
    "env": "environment",
    "shared-credentials-file": "profile",
    "config-file": "profile",
    "assume-role": "profile (assumed role)",
    "sso": "profile (SSO)",
    "custom-process": "profile (credential_process)",
    "assume-role-with-web-identity": "web identity",
    "container-role": "the container's credentials",
    "iam-role": "the instance's credentials",
}


@dataclass(frozen=True)
class AwsSettings:
    """Where an S3 storage goes and how it signs.

    Attributes
    ----------
    region : str
    endpoint : str or None
        A custom endpoint (``http://127.0.0.1:9000``), or ``None`` for AWS's.
    access_key_id, secret_access_key, session_token : str or None
        Static credentials, or ``None`` when they are renewed (``provider``)
        or not needed (anonymous).
    source : str
        Where the credentials came from (``options``, ``environment``,
        ``profile dev``, ``profile dev (SSO)``), or ``""``.
    virtual_hosted : bool
        Whether the bucket is in the host name rather than the path.
    provider : object or None
        obstore's credential provider for keys that expire.
    session : botocore.session.Session or None
        The session the credentials came from (for the multipart calls).
    """

    region: str
    endpoint: str | None
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    source: str
    virtual_hosted: bool = False
    provider: object | None = field(default=None, compare=False, repr=False)
    session: object | None = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        endpoint = scrub_url(self.endpoint) if self.endpoint else None
        return (
            f"AwsSettings(region={self.region!r}, endpoint={endpoint!r}, "
            f"credentials from {self.source or 'nowhere (anonymous)'})"
        )

    @property
    def static(self) -> bool:
        """Whether the credentials are fixed keys (not renewed by a provider)."""
        return bool(self.access_key_id and self.secret_access_key)

    @property
    def signed(self) -> bool:
        """Whether requests are signed at all (not anonymous)."""
        return self.static or self.provider is not None

    def secrets(self) -> tuple[str, ...]:
        """The values no message may hold."""
        found = (self.secret_access_key, self.session_token, self.access_key_id)
        return tuple(s for s in found if s)


def _named(*pairs: tuple[str, str | None]) -> tuple[str, str | None]:
    """The first ``(name, value)`` whose value is set, else ``("", None)``."""
    return next(((n, v) for n, v in pairs if v), ("", None))


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
    if not (_HOST.fullmatch(parts.hostname) or is_ip(parts.hostname)):
        raise refuse(f"{shown(parts.hostname)!r} is not a host name")
    if port == 0:
        raise refuse("the port must be a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise refuse("an endpoint URL has no query or fragment")
    return value


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IP address."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def truthy(value: object) -> bool:
    """Whether a setting says yes (``1``, ``true``, ``yes``, ``on``)."""
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def _botocore():
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        raise ConfigError(
            "S3 storage needs botocore: pip install 'dp-ckpt-plugin[s3]'"
        ) from None
    return botocore


def _session(profile: str | None, environ: Mapping[str, str]):
    """botocore's session of ``profile`` (``None``: ``AWS_PROFILE`` or default)."""
    botocore = _botocore()
    try:
        session = botocore.session.Session(profile=profile)
        session.get_scoped_config()  # reads the files; a missing profile fails here
    except botocore.exceptions.ProfileNotFound:
        name = profile or environ.get("AWS_PROFILE")
        raise ConfigError(
            f"AWS profile {name!r} is in neither "
            f"{session.get_config_variable('credentials_file')} nor "
            f"{session.get_config_variable('config_file')}"
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise ConfigError(f"could not read the AWS files: {_line(exc)}") from None
    return session


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return shown(scrub_url(text), 300)


class CredentialsError(ConfigError):
    """The credential chain found keys it could not use (an expired SSO login,
    a failing ``credential_process``, a role it may not assume)."""


def resolve(options: Mapping[str, object], environ: Mapping[str, str]) -> AwsSettings:
    """The region, endpoint and credentials of an S3 storage (see the module docs).

    Credentials that cannot be found at all leave :attr:`AwsSettings.signed`
    false (the storage says so in one line, unless requests are anonymous).

    Raises
    ------
    ConfigError
        In one line: a malformed region or endpoint (naming where it came
        from), a profile named but not found, an AWS file that cannot be
        read, or credentials the chain found but could not use.
    """
    opt = {k: (str(v) if v is not None else None) for k, v in options.items()}
    explicit = opt.get("profile")
    session = _session(explicit, environ)
    name = session.get_config_variable("profile") or "default"
    profile = session.get_scoped_config()
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
            (f"the endpoint_url of AWS profile {name!r}", _endpoint_of(profile)),
        )
    )
    virtual = truthy(
        opt.get("virtual_hosted_style_request")
        or environ.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
    )
    keys: tuple[str | None, ...] = (None, None, None)
    source, provider = "options", None
    if opt.get("access_key_id") and opt.get("secret_access_key"):
        token = opt.get("session_token") or opt.get("token")
        keys = (opt["access_key_id"], opt["secret_access_key"], token)
    else:
        anonymous = truthy(
            opt.get("skip_signature") or environ.get("AWS_SKIP_SIGNATURE")
        )
        found = None if anonymous else _credentials(session, name)
        if found is None:
            return AwsSettings(region, endpoint, *keys, "", virtual)
        credentials, source = found
        from botocore.credentials import RefreshableCredentials

        # botocore renews these (a role, SSO, a process; its
        # DeferredRefreshableCredentials are RefreshableCredentials too)
        if isinstance(credentials, RefreshableCredentials):
            from obstore.auth.boto3 import Boto3CredentialProvider

            provider = Boto3CredentialProvider(session)
        else:
            frozen = credentials.get_frozen_credentials()
            keys = (frozen.access_key, frozen.secret_key, frozen.token)
    return AwsSettings(region, endpoint, *keys, source, virtual, provider, session)


def _endpoint_of(profile: Mapping[str, object]) -> str | None:
    value = profile.get("endpoint_url")
    if value is None and isinstance(profile.get("s3"), Mapping):
        value = profile["s3"].get("endpoint_url")
    return str(value) if value else None


def _credentials(session, name: str):
    """botocore's credentials and where they came from, or ``None`` if none.

    Their first use is made here (a role assumed, a process run, an SSO
    token read), so what fails is one line now, not a panic later.
    """
    botocore = _botocore()
    try:
        credentials = session.get_credentials()
        if credentials is None:
            return None
        frozen = credentials.get_frozen_credentials()
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise CredentialsError(
            f"AWS profile {name!r}: its credentials could not be had ({_line(e)})"
        ) from None
    if not (frozen.access_key and frozen.secret_key):
        return None
    method = getattr(credentials, "method", "") or ""
    source = _METHODS.get(method, method or "the credential chain")
    if source.startswith("profile"):
        source = f"profile {name}{source.removeprefix('profile')}"
    return credentials, source


# -- the multipart calls ----------------------------------------------------------


class S3RequestError(Exception):
    """A multipart call failed; ``status`` is the HTTP status or ``None``."""

    def __init__(self, cause: str, status: int | None = None) -> None:
        super().__init__(cause)
        self.status = status


class MultipartUploads:
    """``ListMultipartUploads`` and ``AbortMultipartUpload`` on one bucket,
    with botocore's S3 client.

    Parameters
    ----------
    settings : AwsSettings
        Resolved settings with credentials (static or renewed).
    bucket : str
    """

    def __init__(self, settings: AwsSettings, bucket: str) -> None:
        if not settings.signed:
            raise ValueError("listing uploads needs credentials")
        botocore = _botocore()
        from botocore.config import Config

        self.bucket = bucket
        errors = botocore.exceptions
        self._errors = (errors.BotoCoreError, errors.ClientError)
        self._unanswered = (
            errors.EndpointConnectionError,
            errors.ConnectionClosedError,
            errors.ReadTimeoutError,
            errors.ConnectTimeoutError,
        )
        session = settings.session or botocore.session.Session()
        config = Config(
            connect_timeout=REQUEST_TIMEOUT,
            read_timeout=REQUEST_TIMEOUT,
            retries={"max_attempts": REQUEST_ATTEMPTS, "mode": "standard"},
            s3={"addressing_style": "virtual" if settings.virtual_hosted else "path"},
        )
        try:  # keys are None unless static: the session's own are used then
            self._client = session.create_client(
                "s3",
                region_name=settings.region,
                endpoint_url=settings.endpoint,
                config=config,
                aws_access_key_id=settings.access_key_id,
                aws_secret_access_key=settings.secret_access_key,
                aws_session_token=settings.session_token,
            )
        except self._errors as exc:
            raise S3RequestError(_line(exc)) from None

    def _fail(self, what: str, exc: BaseException) -> S3RequestError:
        answer = getattr(exc, "response", None) or {}
        status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = answer.get("Error", {}).get("Code", "")
        if status is not None:
            return S3RequestError(f"{what} answered {status} {code}".rstrip(), status)
        if isinstance(exc, self._unanswered):
            where = urlsplit(self._client.meta.endpoint_url)
            return S3RequestError(
                f"no answer from {where.scheme}://{where.hostname}"
                + (f":{where.port}" if where.port else "")
                + f" ({what}, after {REQUEST_ATTEMPTS} attempts)"
            )
        return S3RequestError(f"{what} failed: {_line(exc)}")

    def list(self, prefix: str, page: int = 1000) -> tuple[list[PendingUpload], float]:
        """The incomplete uploads under ``prefix`` and the server's time now.

        ``page`` uploads are asked for at a time (S3 gives at most 1000).
        """
        found: list[PendingUpload] = []
        server_now = time.time()
        pages = self._client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": page}
        )
        try:
            for answer in pages:
                date = answer["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
                if date:
                    from email.utils import parsedate_to_datetime

                    server_now = parsedate_to_datetime(date).timestamp()
                found += [
                    PendingUpload(u["Key"], u["UploadId"], _seconds(u["Initiated"]))
                    for u in answer.get("Uploads", [])
                ]
        except self._errors as exc:
            raise self._fail("listing uploads", exc) from None
        return found, server_now

    def objects(
        self, prefix: str, delimiter: str | None = None, page: int = 1000
    ) -> tuple[list[ObjectInfo], list[str]]:
        """The objects under ``prefix`` (keys in the bucket), and the common
        prefixes when ``delimiter`` is given (``ListObjectsV2``)."""
        found, folders = [], []
        options = {"Delimiter": delimiter} if delimiter else {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=prefix,
            PaginationConfig={"PageSize": page},
            **options,
        )
        try:
            for answer in pages:
                found += [
                    ObjectInfo(
                        o["Key"], int(o["Size"]), o["ETag"], _seconds(o["LastModified"])
                    )
                    for o in answer.get("Contents", [])
                ]
                folders += [c["Prefix"] for c in answer.get("CommonPrefixes", [])]
        except self._errors as exc:
            raise self._fail("listing objects", exc) from None
        return found, folders

    def abort(self, upload: PendingUpload) -> bool:
        """Abort one upload; ``False`` if it was already gone."""
        try:
            self._client.abort_multipart_upload(
                Bucket=self.bucket, Key=upload.key, UploadId=upload.upload_id
            )
        except self._errors as exc:
            failed = self._fail("aborting an upload", exc)
            if failed.status == 404:
                return False
            raise failed from None
        return True


def _seconds(when: object) -> float:
    if isinstance(when, dt.datetime):
        return when.timestamp()
    return dt.datetime.fromisoformat(str(when).replace("Z", "+00:00")).timestamp()
