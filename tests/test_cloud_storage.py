"""CloudStorage against moto's S3 server: settings, faults, secrets, uploads.

Bad URLs, a missing bucket and missing credentials give one line, fast.
Credentials and endpoint come from the environment or a profile. A server
that is stopped, answers 503, 412 or 409, or holds requests unanswered gives
one :class:`StorageUnavailableError` (or the condition's own error) within a
deadline, at every primitive; a restarted server is used again. No message
holds a secret. Incomplete multipart uploads, including those of an upload
cut by a stopped server, are listed and aborted with signed requests whose
signatures agree with botocore's.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import sys
import threading
import time

import pytest
from s3_server import ACCESS_KEY_ID, MISSING, SECRET_ACCESS_KEY

from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.storage.objects import (
    KeyExistsError,
    StorageUnavailableError,
    VersionMismatchError,
)

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

#: Seconds within which a failing call must have said so (retries included).
DEADLINE = 10.0
#: Retries that keep a test short where the storage's own are not the point.
QUICK_RETRIES = {
    "max_retries": 1,
    "backoff": {
        "init_backoff": dt.timedelta(milliseconds=20),
        "max_backoff": dt.timedelta(milliseconds=50),
        "base": 2,
    },
}


def cloud(url, **options):
    from dp_ckpt_plugin.objectstore.cloud import CloudStorage

    return CloudStorage(url, **options)


def one_line_error(kind, call, *, deadline=DEADLINE, holds=()):
    """Run ``call``; it must raise ``kind`` in time, in one line, with no secret."""
    start = time.monotonic()
    with pytest.raises(kind) as raised:
        call()
    took = time.monotonic() - start
    text = str(raised.value)
    assert took < deadline, f"{took:.1f} s to say: {text}"
    assert "\n" not in text and len(text) < 400, text
    assert SECRET_ACCESS_KEY not in text and SECRET_ACCESS_KEY not in repr(raised.value)
    for part in holds:
        assert part in text, text
    return text


# -- URLs ------------------------------------------------------------------------

BAD_URLS = {
    "s3://": "names no bucket",
    "s3:///x": "names no bucket",
    "s3://Bad_Bucket": "not a valid bucket name",
    "s3://ab/run": "not a valid bucket name",
    "s3://-bucket/run": "not a valid bucket name",
    "s3://my..bucket/run": "not a valid bucket name",
    "s3://192.168.1.1/run": "not a valid bucket name",
    "s3://bucket/a//b": "has empty, '.' or '..' parts",
    "s3://bucket/../x": "has empty, '.' or '..' parts",
    "s3://bucket/run?versionId=1": "no query or fragment",
    "gs://": "names no bucket",
    "gs://Bad_Bucket/x": "not a valid bucket name",
    "az://": "names no container",
    "az://bad--name/x": "not a valid container name",
    "ftp://bucket/run": "unknown scheme 'ftp'",
}


@pytest.mark.parametrize("url", sorted(BAD_URLS))
def test_a_bad_url_is_one_line_naming_it(url):
    text = one_line_error(ConfigError, lambda: cloud(url), deadline=1.0)
    assert BAD_URLS[url] in text
    assert url.split("?")[0].rstrip("/") in text or url in text


@pytest.mark.parametrize(
    ("url", "kind", "bucket", "account"),
    [
        ("gs://my-bucket/run", "gcs", "my-bucket", ""),
        ("abfss://box@acct.dfs.core.windows.net/run", "azure", "box", "acct"),
        ("az://box/run", "azure", "box", ""),  # the account from the environment
    ],
)
def test_gcs_and_azure_storages_are_made_offline(
    monkeypatch, url, kind, bucket, account
):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "fromenv")
    storage = cloud(url)
    assert (storage.kind, storage.bucket, storage.prefix) == (kind, bucket, "run")
    assert storage.capabilities.conditional and not storage.aborts_uploads
    if account:
        assert f'account_name="{account}"' in repr(storage._store)


def test_an_azure_url_without_an_account_is_one_line(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    text = one_line_error(ConfigError, lambda: cloud("az://box/run"), deadline=1.0)
    assert "AZURE_STORAGE_ACCOUNT_NAME" in text and "az://box/run" in text


def test_credentials_in_a_url_are_refused_and_not_repeated():
    text = one_line_error(
        ConfigError, lambda: cloud(f"s3://AKIAX:{SECRET_ACCESS_KEY}@bucket/run")
    )
    assert "***@bucket" in text


# -- settings ----------------------------------------------------------------------


def test_environment_credentials_and_endpoint_are_used(s3_bucket):
    storage = cloud(s3_bucket.url)
    assert storage.settings.source == "environment"
    assert storage.settings.endpoint == s3_bucket.server.endpoint
    storage.put("k", b"v")
    assert s3_bucket.keys() == ["run/k"]
    assert SECRET_ACCESS_KEY not in repr(storage) + repr(storage.settings)


def test_the_s3_endpoint_variable_wins_over_the_general_one(s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_bucket.server.endpoint)
    cloud(s3_bucket.url).put("k", b"v")
    assert s3_bucket.keys() == ["run/k"]


def write_profile(home, name="dev", *, keys=True, endpoint=None, extra=""):
    aws_dir = home / ".aws"
    aws_dir.mkdir(exist_ok=True)
    if keys:
        (aws_dir / "credentials").write_text(
            f"[{name}]\naws_access_key_id = AKIAPROFILEPROFILE\n"
            "aws_secret_access_key = profile-secret-value-1234\n"
        )
    section = "default" if name == "default" else f"profile {name}"
    lines = [f"[{section}]", "region = eu-west-3"]
    if endpoint:
        lines.append(f"endpoint_url = {endpoint}")
    (aws_dir / "config").write_text("\n".join(lines) + "\n" + extra)


@pytest.mark.parametrize("name", ["dev", "default"])
def test_a_profile_gives_keys_region_and_endpoint(
    s3_bucket, monkeypatch, tmp_path, name
):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(var)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    write_profile(tmp_path / "home", name, endpoint=s3_bucket.server.endpoint)
    if name != "default":
        monkeypatch.setenv("AWS_PROFILE", name)
    storage = cloud(s3_bucket.url)
    assert storage.settings.source == f"profile {name}"
    assert storage.settings.access_key_id == "AKIAPROFILEPROFILE"
    assert (storage.settings.region, storage.settings.endpoint) == (
        "eu-west-3",
        s3_bucket.server.endpoint,
    )
    storage.put("k", b"v")
    assert s3_bucket.keys() == ["run/k"]


def test_environment_keys_win_over_aws_profile_and_an_option_profile_over_both(
    s3_env, monkeypatch, tmp_path
):
    write_profile(tmp_path / "home")
    monkeypatch.setenv("AWS_PROFILE", "dev")
    assert cloud("s3://bucket1/run").settings.source == "environment"
    explicit = cloud("s3://bucket1/run", profile="dev")
    assert explicit.settings.source == "profile dev"
    given = cloud(
        "s3://bucket1/run", access_key_id="AKIAOPT", secret_access_key="x" * 9
    )
    assert given.settings.source == "options"


def test_a_named_profile_that_is_not_there_is_one_line(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "nosuch")
    text = one_line_error(
        ConfigError, lambda: cloud("s3://bucket1/run", profile="nosuch")
    )
    assert "'nosuch'" in text


def _process_profile(home, command, name="dev"):
    """A profile whose keys come from ``credential_process`` (and no file keys)."""
    write_profile(home, name, keys=False, extra=f"credential_process = {command}\n")


def _printing_keys() -> str:
    code = (
        "import json; print(json.dumps({'Version': 1, "
        "'AccessKeyId': 'AKIAPROCESSPROCESS', "
        "'SecretAccessKey': 'process-secret-value-1234', "
        "'SessionToken': 'process-token', "
        "'Expiration': '2999-01-01T00:00:00Z'}))"
    )
    return f'{sys.executable} -c "{code}"'


def test_a_credential_process_profile_gives_renewed_keys(
    s3_bucket, monkeypatch, tmp_path
):
    """botocore's chain runs the process; obstore renews through the provider,
    and the multipart calls sign with the same keys."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    _process_profile(tmp_path / "home", _printing_keys())
    monkeypatch.setenv("AWS_PROFILE", "dev")
    storage = cloud(s3_bucket.url)
    assert storage.settings.source == "profile dev (credential_process)"
    assert storage.settings.provider is not None and not storage.settings.static
    storage.put("k", b"v")
    assert s3_bucket.keys() == ["run/k"]
    assert storage.aborts_uploads
    assert storage.abort_incomplete_uploads("", older_than_seconds=0) == 0


def test_an_assumed_role_profile_gets_its_keys_from_sts(
    s3_bucket, monkeypatch, tmp_path
):
    """``role_arn`` with a ``source_profile``: STS (the test server's) gives keys."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    write_profile(tmp_path / "home", "base")
    with open(tmp_path / "home" / ".aws" / "config", "a") as config:
        config.write(
            "[profile dev]\nrole_arn = arn:aws:iam::123456789012:role/trainer\n"
            "source_profile = base\nregion = us-east-1\n"
        )
    monkeypatch.setenv("AWS_PROFILE", "dev")
    storage = cloud(s3_bucket.url)
    assert storage.settings.source == "profile dev (assumed role)"
    storage.put("k", b"v")
    assert s3_bucket.keys() == ["run/k"]


@pytest.mark.parametrize("how", ["failing process", "sso without a login"])
def test_credentials_the_chain_cannot_have_are_one_line_naming_the_profile(
    s3_env, monkeypatch, tmp_path, how
):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    home = tmp_path / "home"
    if how == "failing process":
        _process_profile(home, f'{sys.executable} -c "import sys; sys.exit(3)"')
    else:
        write_profile(
            home,
            keys=False,
            extra="sso_session = corp\nsso_account_id = 123456789012\n"
            "sso_role_name = trainer\n[sso-session corp]\n"
            "sso_start_url = https://example.invalid/start\nsso_region = us-east-1\n",
        )
    monkeypatch.setenv("AWS_PROFILE", "dev")
    text = one_line_error(ConfigError, lambda: cloud("s3://bucket1/run"))
    assert text.startswith("AWS profile 'dev': its credentials could not be had")


def test_no_credentials_is_one_line_before_any_request(s3_env, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    text = one_line_error(
        StorageUnavailableError, lambda: cloud("s3://bucket1/run"), deadline=1.0
    )
    assert "no AWS credentials" in text and "s3://bucket1/run" in text


def test_no_credentials_and_no_metadata_service_is_one_line_in_time(
    s3_bucket, monkeypatch
):
    """With the metadata service allowed, its silence (a closed port here) is named."""
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_EC2_METADATA_DISABLED",
    ):
        monkeypatch.delenv(var)
    text = one_line_error(
        StorageUnavailableError, lambda: cloud(s3_bucket.url).head("k")
    )
    assert "no AWS credentials" in text and "metadata service" in text


def test_a_missing_bucket_is_one_line(s3_env):
    storage = cloud("s3://no-such-bucket-here/run")
    for call in (storage.check, lambda: storage.put("k", b"v")):
        text = one_line_error(StorageUnavailableError, call, deadline=3.0)
        assert "the bucket no-such-bucket-here does not exist" in text


def test_requests_are_counted_per_put(s3_bucket, tmp_path):
    from dp_ckpt_plugin.objectstore.cloud import PART_SIZE

    storage = cloud(s3_bucket.url)
    path = tmp_path / "p.bin"
    path.write_bytes(b"x" * (PART_SIZE * 2 + 1))
    with path.open("rb") as handle:
        storage.put("big", handle)
    assert storage.counts["requests"] == 1 + 3 + 1  # create, 3 parts, complete
    storage.put("small", b"x")
    assert storage.counts["put"] == 2 and storage.counts["requests"] == 6


def test_check_passes_on_a_bucket_that_is_there(s3_bucket):
    cloud(s3_bucket.url).check()


def test_obstore_is_imported_only_when_a_storage_is_made():
    import subprocess
    import sys

    code = (
        "import sys, dp_ckpt_plugin.objectstore.cloud, dp_ckpt_plugin.objectstore.registry\n"
        "import dp_ckpt_plugin\n"
        "print('obstore' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


# -- a server that goes away -------------------------------------------------------

CALLS = {
    "put": lambda s: s.put("obj", b"new"),
    "put_large": lambda s: s.put("obj", b"x" * (40 << 20)),
    "put_if_absent": lambda s: s.put_if_absent("fresh", b"x"),
    "put_if_match": lambda s: s.put_if_match("obj", b"y", s.head("obj").version),
    "get": lambda s: s.get("obj"),
    "get_range": lambda s: s.get_range("obj", 0, 2),
    "download": lambda s: s.download("obj", io.BytesIO()),
    "head": lambda s: s.head("obj"),
    "list": lambda s: list(s.list("")),
    "delete": lambda s: s.delete("obj"),
    "check": lambda s: s.check(),
}


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_stopped_server_is_one_line_in_time_and_a_restarted_one_serves(s3_bucket, op):
    # the storage's own retries for one call; quick ones for the others
    storage = cloud(
        s3_bucket.url, **({} if op == "head" else {"retry_config": QUICK_RETRIES})
    )
    storage.put("obj", b"old")
    before = storage.head("obj").version if op == "put_if_match" else None
    s3_bucket.server.stop()
    try:
        if op == "put_if_match":
            call = lambda: storage.put_if_match("obj", b"y", before)  # noqa: E731
        else:
            call = lambda: CALLS[op](storage)  # noqa: E731
        text = one_line_error(StorageUnavailableError, call)
        assert s3_bucket.url in text and "no answer from" in text
    finally:
        s3_bucket.server.start()
    assert storage.get("obj")[0] == b"old"
    CALLS[op](storage)


def test_a_server_killed_mid_upload_leaves_the_old_object_and_an_upload_to_abort(
    s3_bucket,
):
    storage = cloud(s3_bucket.url)
    storage.put("payload", b"old")
    failed = []

    def upload():
        try:
            storage.put("payload", b"n" * (200 << 20))
        except StorageUnavailableError as exc:
            failed.append(str(exc))

    thread = threading.Thread(target=upload)
    thread.start()
    deadline = time.monotonic() + 30
    while not s3_bucket.uploads() and time.monotonic() < deadline:
        time.sleep(0.01)
    s3_bucket.server.stop()
    thread.join(DEADLINE * 3)
    s3_bucket.server.start()
    assert not thread.is_alive()
    assert failed and "no answer from" in failed[0], failed
    assert storage.get("payload")[0] == b"old"
    left = len(s3_bucket.uploads())
    assert left == 1  # obstore could not abort it: the server was away
    assert storage.abort_incomplete_uploads("", older_than_seconds=0) == left
    assert s3_bucket.uploads() == []
    storage.put("payload", b"new")
    assert storage.get("payload")[0] == b"new"


# -- injected answers --------------------------------------------------------------


def proxied(s3_bucket, fault_proxy, **options):
    return cloud(s3_bucket.url, endpoint=fault_proxy.endpoint, **options)


def test_a_passing_503_is_retried_by_the_storage(s3_bucket, fault_proxy):
    storage = proxied(s3_bucket, fault_proxy)
    storage.put("obj", b"v")
    fault_proxy.fail(503, times=2, method="HEAD")
    assert storage.head("obj").size == 1
    assert fault_proxy.requests["HEAD"] == 3
    assert storage.counts["head"] == 1


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_lasting_503_at_every_call_is_one_line_in_time(s3_bucket, fault_proxy, op):
    retries = {} if op == "head" else {"retry_config": QUICK_RETRIES}
    storage = proxied(s3_bucket, fault_proxy, **retries)
    storage.put("obj", b"old")
    version = storage.head("obj").version
    fault_proxy.fail(503, times=1000)
    call = (
        (lambda: storage.put_if_match("obj", b"y", version))
        if op == "put_if_match"
        else (lambda: CALLS[op](storage))
    )
    text = one_line_error(StorageUnavailableError, call, holds=("503",))
    assert s3_bucket.url in text
    assert f"after {1 if retries else 3} retries" in text, text


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_server_that_does_not_answer_at_every_call_is_one_line_in_time(
    s3_bucket, fault_proxy, op
):
    storage = proxied(
        s3_bucket,
        fault_proxy,
        client_options={"timeout": dt.timedelta(seconds=0.5)},
        retry_config={"max_retries": 1},
    )
    storage.put("obj", b"old")
    version = storage.head("obj").version
    fault_proxy.stall(3.0, times=1000)
    call = (
        (lambda: storage.put_if_match("obj", b"y", version))
        if op == "put_if_match"
        else (lambda: CALLS[op](storage))
    )
    text = one_line_error(StorageUnavailableError, call, deadline=8.0)
    assert s3_bucket.url in text


def test_an_injected_412_is_a_condition_error(s3_bucket, fault_proxy):
    storage = proxied(s3_bucket, fault_proxy)
    info = storage.put("obj", b"v")
    fault_proxy.fail(412, method="PUT")
    with pytest.raises(VersionMismatchError):
        storage.put_if_match("obj", b"w", info.version)
    fault_proxy.fail(412, method="PUT")
    with pytest.raises(KeyExistsError):
        storage.put_if_absent("other", b"w")
    assert storage.get("obj")[0] == b"v" and storage.head("other") is None


@pytest.mark.parametrize("op", ["put_if_absent", "put_if_match"])
def test_a_409_conflict_of_a_conditional_put_is_sent_again(s3_bucket, fault_proxy, op):
    storage = proxied(s3_bucket, fault_proxy)
    info = storage.put("obj", b"v")
    fault_proxy.fail(409, times=2, method="PUT")
    if op == "put_if_absent":
        storage.put_if_absent("fresh", b"w")
        assert storage.get("fresh")[0] == b"w"
    else:
        storage.put_if_match("obj", b"w", info.version)
        assert storage.get("obj")[0] == b"w"
    assert fault_proxy.requests["PUT"] == 1 + 2 + 1


def test_a_lasting_409_is_one_line_not_a_condition(s3_bucket, fault_proxy):
    storage = proxied(s3_bucket, fault_proxy)
    fault_proxy.fail(409, times=1000, method="PUT")
    text = one_line_error(
        StorageUnavailableError, lambda: storage.put_if_absent("fresh", b"w")
    )
    assert "409 Conflict" in text


# -- secrets ---------------------------------------------------------------------


def test_no_secret_in_any_message_or_log(s3_bucket, fault_proxy, caplog):
    caplog.set_level(logging.DEBUG)
    storage = proxied(
        s3_bucket,
        fault_proxy,
        session_token="planted-session-token-42",
        retry_config=QUICK_RETRIES,
    )
    messages = []
    fault_proxy.fail(503, times=1000)
    for op in sorted(CALLS):
        try:
            CALLS[op](storage) if op != "put_if_match" else storage.put_if_match(
                "obj", b"x", "v"
            )
        except Exception as exc:
            messages += [str(exc), repr(exc)]
    fault_proxy.rules.clear()
    s3_bucket.server.stop()
    try:
        for op in ("head", "put", "list"):
            with pytest.raises(StorageUnavailableError) as raised:
                CALLS[op](storage)
            messages.append(str(raised.value))
    finally:
        s3_bucket.server.start()
    assert len(messages) >= 2 * len(CALLS)
    everything = "\n".join(messages + [r.getMessage() for r in caplog.records])
    everything += repr(storage) + repr(storage.settings)
    for secret in (SECRET_ACCESS_KEY, "planted-session-token-42"):
        assert secret not in everything


def test_describe_scrubs_what_obstore_may_word():
    """obstore's own error objects, with credentials in their text, come out clean."""
    import obstore.exceptions as oe

    from dp_ckpt_plugin.objectstore.cloud import CloudStorage, describe

    storage = object.__new__(CloudStorage)
    storage._secrets = (SECRET_ACCESS_KEY, ACCESS_KEY_ID)
    texts = [
        f"Generic S3 error: Error performing PUT http://h/b/k?X-Amz-Credential={ACCESS_KEY_ID}"
        "&X-Amz-Signature=0123abcd in 3ms - Server returned non-2xx status code: "
        "403 Forbidden: <Error><Code>AccessDenied</Code><Message>no</Message></Error>",
        f"Unauthenticated: Authorization: AWS4-HMAC-SHA256 {SECRET_ACCESS_KEY}",
        f"config error: secret_access_key={SECRET_ACCESS_KEY} AccountKey=abc;x",
        "Generic error: https://acct.blob.core.windows.net/c/k?sv=1&sig=SASSECRET",
    ]
    for text in texts:
        for kind in (
            oe.GenericError,
            oe.UnauthenticatedError,
            oe.PermissionDeniedError,
        ):
            said = describe(kind(text), storage._scrub, "b")
            assert SECRET_ACCESS_KEY not in said and "SASSECRET" not in said
            assert "0123abcd" not in said and ACCESS_KEY_ID not in said
    said = describe(oe.PermissionDeniedError(texts[0]), storage._scrub, "b")
    assert said.startswith("access denied, the server answered 403 Forbidden"), said


# -- incomplete multipart uploads ------------------------------------------------


def start_upload(s3_bucket, key):
    client = s3_bucket.server.client()
    upload = client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)
    client.upload_part(
        Bucket=s3_bucket.name,
        Key=key,
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=b"p" * 1024,
    )
    return upload["UploadId"]


def test_abort_incomplete_uploads_under_the_prefix_only(s3_bucket):
    storage = cloud(s3_bucket.url)
    for key in ("run/a/1", "run/a/2", "run/b", "run2/a", "other/run/a"):
        start_upload(s3_bucket, key)
    assert storage.aborts_uploads
    # moto says every upload began at one fixed time in 2010
    initiated = s3_bucket.uploads()[0]["Initiated"].timestamp()
    assert initiated < time.time() - 3600
    age = time.time() - initiated
    assert storage.abort_incomplete_uploads("", older_than_seconds=age + 3600) == 0
    assert len(s3_bucket.uploads()) == 5
    assert storage.abort_incomplete_uploads("a/", older_than_seconds=0) == 2
    assert sorted(u["Key"] for u in s3_bucket.uploads()) == [
        "other/run/a",
        "run/b",
        "run2/a",
    ]
    assert storage.abort_incomplete_uploads("", older_than_seconds=0) == 1
    assert sorted(u["Key"] for u in s3_bucket.uploads()) == ["other/run/a", "run2/a"]
    assert storage.counts["abort_incomplete_uploads"] == 3


def test_abort_pages_through_a_long_listing(s3_bucket):
    storage = cloud(s3_bucket.url)
    for i in range(7):
        s3_bucket.server.client().create_multipart_upload(
            Bucket=s3_bucket.name, Key=f"run/k{i}"
        )
    for _ in range(2):  # the same key again: the listing pages by key and id
        s3_bucket.server.client().create_multipart_upload(
            Bucket=s3_bucket.name, Key="run/k3"
        )
    assert storage.abort_incomplete_uploads("", older_than_seconds=0, page=2) == 9
    assert s3_bucket.uploads() == []


def test_abort_on_a_stopped_server_is_one_line(s3_bucket):
    storage = cloud(s3_bucket.url)
    s3_bucket.server.stop()
    try:
        text = one_line_error(
            StorageUnavailableError,
            lambda: storage.abort_incomplete_uploads("", older_than_seconds=0),
            deadline=15.0,
        )
    finally:
        s3_bucket.server.start()
    assert "no answer from" in text


def test_abort_needs_credentials(s3_bucket, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")  # anonymous requests
    storage = cloud(s3_bucket.url)
    assert not storage.aborts_uploads
    text = one_line_error(
        StorageUnavailableError,
        lambda: storage.abort_incomplete_uploads("", older_than_seconds=0),
        deadline=1.0,
    )
    assert "lifecycle rule" in text
