"""Secrets and a bad environment: one line before any client, nothing secret said.

Generated over malformed endpoints (every variable and option that can give
one), malformed regions and URLs with one slash, each at every front that
opens a store: the storage itself, ``dp-ckpt`` and the manager (``dp
train`` in ``test_e2e_s3.py``). The userinfo of an endpoint is scrubbed
from everything shown, and the lease's holder note names the program, not
its arguments.
"""

from __future__ import annotations

import json
import secrets
import sys

import pytest

from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import ConfigError
from dp_ckpt_plugin.objectstore.registry import storage_for
from dp_ckpt_plugin.storage.objects import StorageUnavailableError
from dp_ckpt_plugin.text import shown

PASSWORD = "hunter2-Sekr1t"
#: Malformed endpoints, and a word of what the line must say.
BAD_ENDPOINTS = {
    "localhost:9000": "starts with http:// or https://",
    "127.0.0.1:9000": "starts with http:// or https://",
    "ftp://127.0.0.1:9000": "starts with http:// or https://",
    "http://local host:9000": "no space",
    " http://127.0.0.1:9000": "no space",
    "http://127.0.0.1:9000\n": "no space",
    "http://127.0.0.1:9000\x1b[31m": "no space",
    "http://127.0.0.1:99999": "port must be a number from 1 to 65535",
    "http://127.0.0.1:0": "port must be a number from 1 to 65535",
    "http://127.0.0.1:-1": "port must be a number from 1 to 65535",
    "http://127.0.0.1:port": "port must be a number from 1 to 65535",
    "http://": "names no host",
    "http://:9000": "names no host",
    "http://[::1": "not a URL",
    "http://ho_st%20x:9000": "is not a host name",
    "http://127.0.0.1:9000/?x=1": "no query",
    f"http://user:{PASSWORD}@127.0.0.1:99999": "port must be",
    f"localhost:{PASSWORD}@9000": "starts with http",
}
#: Where an endpoint can come from: (environment variable or option, how).
SOURCES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "option endpoint")
BAD_REGIONS = ("us east 1", "us-east-1\n", "../x", "a" * 100, "eu-\x1b[2J")


def _endpoint_case(monkeypatch, source, value):
    options = {}
    if source.startswith("option "):
        options[source.removeprefix("option ")] = value
        name = f"the option {source.removeprefix('option ')}"
    else:
        monkeypatch.setenv(source, value)
        name = source
    return options, name


def _one_clean_line(text: str) -> None:
    assert "\n" not in text.strip(), text
    assert PASSWORD not in text
    assert "Traceback" not in text and "panic" not in text.lower()
    assert shown(text.strip()) == text.strip()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("value", sorted(BAD_ENDPOINTS))
def test_a_malformed_endpoint_is_one_line_before_any_client(
    s3_env, monkeypatch, source, value
):
    for other in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT"):
        monkeypatch.delenv(other, raising=False)
    options, name = _endpoint_case(monkeypatch, source, value)
    from dp_ckpt_plugin.objectstore import cloud

    built = []
    monkeypatch.setattr(
        cloud.CloudStorage, "_open", lambda *a, **k: built.append(a) or None
    )
    with pytest.raises(ConfigError) as caught:
        storage_for("s3://bucket/run", **options)
    message = str(caught.value)
    _one_clean_line(message)
    assert message.startswith(f"{name} is ")
    assert BAD_ENDPOINTS[value] in message
    assert built == []  # refused before any client was built


def commands_on_a_url(tmp_path):
    """Every ``dp-ckpt`` command that opens a remote store."""
    url = "s3://bucket/run"
    return (
        ["ls", url],
        ["verify", url],
        ["show", url],
        ["resolve", "latest", "--dir", url],
        ["inspect", url],
        ["prune", url, "--keep-last", "1"],
        ["prune", url, "--release-lease"],
        ["sync", url, str(tmp_path / "copy")],
    )


@pytest.mark.parametrize("value", sorted(BAD_ENDPOINTS))
def test_dp_ckpt_and_the_manager_say_a_malformed_endpoint_in_one_line(
    s3_env, monkeypatch, capsys, value, tmp_path
):
    from helpers import plugin_manager

    from dp_ckpt_plugin import CheckpointManager

    monkeypatch.setenv("AWS_ENDPOINT_URL", value)
    for argv in commands_on_a_url(tmp_path):
        assert main(argv) != 0
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("dp-ckpt: error: AWS_ENDPOINT_URL is "), err
        _one_clean_line(err)
    with pytest.raises(ConfigError, match=r"^AWS_ENDPOINT_URL is ") as caught:
        CheckpointManager(
            "s3://bucket/run", staging=tmp_path / "s", pm=plugin_manager()
        )
    _one_clean_line(str(caught.value))


@pytest.mark.parametrize("value", BAD_REGIONS)
@pytest.mark.parametrize("source", ["AWS_REGION", "AWS_DEFAULT_REGION", "option"])
def test_a_malformed_region_is_one_line_naming_where_it_came_from(
    s3_env, monkeypatch, source, value
):
    monkeypatch.delenv("AWS_REGION", raising=False)
    options = {}
    if source == "option":
        options["region"] = value
        name = "the option region"
    else:
        monkeypatch.setenv(source, value)
        name = source
    with pytest.raises(ConfigError) as caught:
        storage_for("s3://bucket/run", **options)
    assert str(caught.value).startswith(f"{name} is ")
    assert "not an AWS region" in str(caught.value)
    _one_clean_line(str(caught.value))


def test_dp_ckpt_and_the_manager_say_a_malformed_region_in_one_line(
    s3_env, monkeypatch, capsys, tmp_path
):
    from helpers import plugin_manager

    from dp_ckpt_plugin import CheckpointManager

    monkeypatch.setenv("AWS_REGION", "us east\x1b[2J")
    for argv in commands_on_a_url(tmp_path):
        assert main(argv) != 0
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("dp-ckpt: error: AWS_REGION is "), err
        _one_clean_line(err)
    with pytest.raises(ConfigError, match=r"^AWS_REGION is ") as caught:
        CheckpointManager(
            "s3://bucket/run", staging=tmp_path / "s", pm=plugin_manager()
        )
    _one_clean_line(str(caught.value))


def test_a_sound_endpoint_and_region_pass(s3_bucket):
    storage = storage_for(s3_bucket.url, region="eu-central-1")
    storage.check()
    assert storage.settings.region == "eu-central-1"


def test_the_userinfo_of_an_endpoint_is_never_shown(s3_env, monkeypatch, caplog):
    """An endpoint with a password that does not answer: errors and logs scrubbed."""
    from helpers import free_port

    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://admin:{PASSWORD}@127.0.0.1:{port}")
    storage = storage_for("s3://bucket/run")
    assert PASSWORD not in repr(storage.settings)
    with pytest.raises(StorageUnavailableError) as caught:
        storage.check()
    message = str(caught.value)
    assert PASSWORD not in message and "no answer from http://" in message
    assert shown(f"see http://admin:{PASSWORD}@host/x") == "see http://***@host/x"


# -- s3:/bucket/run -------------------------------------------------------------------

ONE_SLASH = {
    "s3:/bucket/run": "s3://bucket/run",
    "s3:bucket/run": "s3://bucket/run",
    "S3:/bucket/run": "s3://bucket/run",
    "gs:/bucket/run": "gs://bucket/run",
    "az:/container/run": "az://container/run",
    "memory:/b/run": "memory://b/run",
    "s3:/": "s3://BUCKET/PREFIX",
}


@pytest.mark.parametrize("text", sorted(ONE_SLASH))
def test_a_url_with_one_slash_is_refused_everywhere_saying_what_was_meant(
    text, capsys, tmp_path, monkeypatch
):
    from helpers import plugin_manager

    from dp_ckpt_plugin import CheckpointManager
    from dp_ckpt_plugin.deepmd.argcheck import check_save_dir

    monkeypatch.chdir(tmp_path)
    meant = f"did you mean {ONE_SLASH[text]}"
    with pytest.raises(ConfigError, match=f"^`training.save_dir` is .*{meant}$"):
        check_save_dir(text)
    with pytest.raises(ConfigError, match=f"{meant}$"):
        storage_for(text)
    with pytest.raises(ConfigError, match=f"{meant}$"):
        CheckpointManager(text, pm=plugin_manager())
    for argv in (["ls", text], ["verify", text], ["sync", text, str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.rstrip().endswith(meant) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []  # no folder named like the scheme


@pytest.mark.parametrize("text", ["file:/x", "foo:/x", "C:/x", "dir/s3:/x", "s3x"])
def test_what_is_not_a_known_scheme_stays_a_path(text):
    from dp_ckpt_plugin.objectstore.registry import check_not_mistyped

    check_not_mistyped(text)


# -- the holder note -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, program",
    [
        (["/opt/bin/dp", "--pt", "train", "in.json", f"--token={PASSWORD}"], "dp"),
        (["/x/site-packages/pytest/__main__.py", PASSWORD], "pytest"),
        (["-c", PASSWORD], None),
        ([], None),
    ],
)
def test_the_lease_names_the_program_never_its_arguments(monkeypatch, argv, program):
    from doubles.memory import MemoryStorage, forget

    from dp_ckpt_plugin.remote.lease import Holder, Lease

    monkeypatch.setattr(sys, "argv", argv)
    holder = Holder.this_process()
    assert holder.command == (program or holder.command)
    assert PASSWORD not in json.dumps(holder.__dict__)
    bucket = f"s{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        lease = Lease(storage)
        lease.acquire()
        stored = storage.get("LEASE")[0].decode()
        assert PASSWORD not in stored
        assert json.loads(stored)["holder"]["command"] == holder.command
        lease.release()
    finally:
        forget(bucket)


# -- URLs with control characters -------------------------------------------------------

CONTROL_URLS = (
    "s3://bucket/r\nun",
    "s3://bucket/r\x1b[31mun",
    "s3://bucket/run\r",
    "s3://buc\tket/run",
    "s3://bucket/r\u202eun",
    "memory://bucket/r\nun",
)


@pytest.mark.parametrize("url", CONTROL_URLS)
def test_a_url_with_a_control_character_is_one_line_everywhere(s3_env, capsys, url):
    """Never silently another URL (Python's URL parser drops a newline)."""
    from dp_ckpt_plugin.deepmd.argcheck import check_save_url

    with pytest.raises(ConfigError, match="holds no control character") as caught:
        storage_for(url)
    _one_clean_line(str(caught.value))
    with pytest.raises(ConfigError, match="holds no control character") as caught:
        check_save_url(url)
    _one_clean_line(str(caught.value))
    assert main(["ls", url]) != 0
    err = capsys.readouterr().err
    assert "holds no control character" in err
    _one_clean_line(err)
