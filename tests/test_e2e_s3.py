"""End to end: ``training.save_dir: "s3://..."`` with the real ``dp``, against moto.

moto's S3 server runs on loopback for the module (``s3_server``), one bucket
for the module; each test works under its own prefix. Each "node" is a
working directory with its own staging directory (``DP_CKPT_STAGING``): they
share no file system but the S3 endpoint.

- the README's job on ``s3://``, ``dp --pt-expt``: train, ``--restart latest``
  on another node (empty staging), ``freeze -c s3://...``, ``dp-ckpt`` on the
  URL; the same train and restart with ``dp --pt``;
- a stop signal: the run ends once the checkpoint of the step it stopped at is
  uploaded, and HEAD names it;
- a bad URL, a missing bucket, no credentials: one line, before any model is
  built;
- two nodes (``torchrun --nnodes 2`` on loopback, one rank each): a run
  stopped after the commit of step 10, continued with the node ranks swapped
  (the chief on the other node) and ``--restart latest``, is the uninterrupted
  run (``lcurve.out`` rows and final tensors).

Run with ``pytest tests/test_e2e_s3.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_support import (
    DP,
    E2E_MARKS,
    TORCHRUN,
    dp,
    dp_env,
    example_config,
    load_payload,
    make_data,
    make_workdir,
    run,
    start,
    wait_for,
)
from helpers import free_port

pytestmark = E2E_MARKS

DP_CKPT = DP.parent / "dp-ckpt"


@pytest.fixture(scope="module")
def s3(s3_server):
    """The module's bucket and the AWS variables of its endpoint."""
    import os

    from s3_server import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY

    bucket = s3_server.make_bucket()
    env = {
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # for the test's own reads of the store
    yield bucket, env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    s3_server.start()
    s3_server.remove_bucket(bucket)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_s3")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=6)


def url_of(s3) -> str:
    bucket, _ = s3
    return f"s3://{bucket}/{secrets.token_hex(4)}"


def node(base: Path, name: str, data: Path, url: str, **training) -> Path:
    """A working directory (a node) whose input saves to ``url``."""
    config = example_config(save_dir=url, **training)
    return make_workdir(base, name, data, config)


def env_of(s3, workdir: Path, **extra: str) -> dict[str, str]:
    _, aws = s3
    return dp_env(**aws, DP_CKPT_STAGING=str(workdir / "staging"), **extra)


def head_of(s3, url: str):
    """HEAD of the store at ``url`` and its storage (read from the test)."""
    from dp_ckpt_plugin.objectstore.registry import storage_for
    from dp_ckpt_plugin.remote import head as heads

    storage = storage_for(url)
    return heads.read(storage)[0], storage


def test_the_readme_job_on_s3(base, data, s3):
    url = url_of(s3)
    first = node(base, "readme_a", data, url)
    out = run(dp("train", "input.json"), first, env=env_of(s3, first)).check().output
    assert f"save_dir {url} (staged in" in out
    assert f"the latest checkpoint is {url}/e000001/model.ckpt-20.pt (step 20)" in out
    second = node(base, "readme_b", data, url, numb_steps=30)
    out = (
        run(
            dp("train", "input.json", "--restart", "latest", "--skip-neighbor-stat"),
            second,
            env=env_of(s3, second),
        )
        .check()
        .output
    )
    assert f"the latest model.ckpt of HEAD ({url}/e000001/model.ckpt-20.pt)" in out
    # the other node read the first run's input from the store: it says what
    # changed (numb_steps 20 -> 30), and so that the resume is not exact
    assert (
        "resume at step 20 is not exact: training.numb_steps 20 -> 30, the "
        "learning-rate schedule and loss prefactors follow numb_steps"
    ) in out
    head, _ = head_of(s3, url)
    state = head.family("model.ckpt")
    assert [e.step for e in state.kept] == [25, 30] and state.published.step == 30
    assert head.epoch == 2
    # nothing is made at a local path spelled like the URL
    assert not (second / "s3:").exists() and not (first / "s3:").exists()
    run(dp("freeze", "-c", url, "-o", "frozen"), second, env=env_of(s3, second)).check()
    assert (second / "frozen.pte").stat().st_size > 0
    found = run(
        [DP_CKPT, "resolve", "latest", "--dir", url, "--path"],
        second,
        env=env_of(s3, second),
    ).check()
    assert found.stdout.strip() == f"{url}/e000002/model.ckpt-30.pt"
    checked = run([DP_CKPT, "verify", url], second, env=env_of(s3, second)).check()
    assert "2 of 2 checkpoint(s)" in checked.stdout


def test_dp_pt_trains_and_restarts_on_s3(base, data, s3):
    url = url_of(s3)
    first = node(base, "pt_a", data, url)
    run(dp("train", "input.json", backend="pt"), first, env=env_of(s3, first)).check()
    second = node(base, "pt_b", data, url, numb_steps=30)
    out = (
        run(
            dp(
                "train",
                "input.json",
                "--restart",
                "latest",
                "--skip-neighbor-stat",
                backend="pt",
            ),
            second,
            env=env_of(s3, second),
        )
        .check()
        .output
    )
    assert f"({url}/e000001/model.ckpt-20.pt)" in out
    head, _ = head_of(s3, url)
    assert head.family("model.ckpt").published.step == 30


def test_a_stop_signal_ends_after_the_upload(base, data, s3):
    url = url_of(s3)
    workdir = node(base, "signal", data, url, numb_steps=100000, save_freq=50)
    log = workdir / "train.log"
    _, aws = s3
    proc = start(
        dp("train", "input.json", "--skip-neighbor-stat"),
        workdir,
        log,
        **aws,
        DP_CKPT_STAGING=str(workdir / "staging"),
    )
    try:
        wait_for(log, r"saved step 50:", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text("utf-8")
    import re

    (stopped,) = map(int, re.findall(r"SIGTERM: stopped after step (\d+);", text))
    head, _ = head_of(s3, url)
    assert head.family("model.ckpt").published.step == stopped


@pytest.mark.parametrize(
    "case",
    ["bad-url", "missing-bucket", "no-credentials", "bad-endpoint", "one-slash"],
)
def test_a_store_that_cannot_be_used_fails_in_one_line_before_the_build(
    base, data, s3, case
):
    bucket, aws = s3
    url = {
        "bad-url": "s3://Bad_Bucket/run",
        "missing-bucket": "s3://no-such-bucket-x/run",
        "one-slash": f"s3:/{bucket}/run",
    }
    workdir = node(base, f"bad_{case}", data, url.get(case, f"s3://{bucket}/nocred"))
    env = env_of(s3, workdir)
    if case == "no-credentials":
        env.pop("AWS_ACCESS_KEY_ID")
        env.pop("AWS_SECRET_ACCESS_KEY")
        env["HOME"] = str(workdir)
    if case == "bad-endpoint":  # no scheme: the client would panic
        env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL"].split("://", 1)[1]
    result = run(dp("train", "input.json"), workdir, env=env, timeout=120)
    assert result.returncode != 0
    assert "Start to train" not in result.output and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "ERROR" in line]
    assert len(errors) == 1, result.describe()
    assert aws["AWS_SECRET_ACCESS_KEY"] not in result.output
    said = {
        "bad-endpoint": "AWS_ENDPOINT_URL is ",
        "one-slash": f"did you mean s3://{bucket}/run",
    }
    assert said.get(case, "") in errors[0]
    assert "panic" not in result.output.lower()
    assert not (workdir / "s3:").exists()


# -- two nodes ------------------------------------------------------------------


def two_nodes(nodes: list[Path], s3, *args: str, timeout: float = 300) -> list[str]:
    """``torchrun --nnodes 2`` with one rank on each of ``nodes`` (node rank = index)."""
    port = free_port()
    procs = []
    for rank, workdir in enumerate(nodes):
        log = workdir / f"node{rank}.log"
        argv = [
            str(TORCHRUN),
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node_rank={rank}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            *dp("train", "input.json", "--skip-neighbor-stat", *args),
        ]
        handle = open(log, "w")  # noqa: SIM115 - closed when the process ends
        procs.append(
            (
                subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=env_of(s3, workdir),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    deadline = time.monotonic() + timeout
    for proc, log in procs:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.returncode == 0, log.read_text("utf-8")[-3000:]
    return [log.read_text("utf-8") for _, log in procs]


def rows(workdir: Path) -> dict[int, str]:
    lines = (workdir / "lcurve.out").read_text("utf-8").splitlines()
    return {int(x.split()[0]): x for x in lines if x.strip() and not x.startswith("#")}


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun at {TORCHRUN}")
def test_two_nodes_continue_exactly_with_the_chief_on_the_other_node(base, data, s3):
    import torch

    from dp_ckpt_plugin.remote import head as heads

    straight_url, url = url_of(s3), url_of(s3)
    straight = [
        node(base, f"straight_{n}", data, straight_url, save_freq=10) for n in "ab"
    ]
    two_nodes(straight, s3)
    head, storage = head_of(s3, straight_url)
    assert head.family("model.ckpt").published.step == 20
    # the same run, stopped after the commit of step 10: its store holds step 10 only
    first = [
        node(base, f"first_{n}", data, url, save_freq=10, numb_steps=20) for n in "ab"
    ]
    two_nodes(first, s3)
    head, storage = head_of(s3, url)
    state = head.family("model.ckpt")
    ten = next(e for e in state.kept if e.step == 10)
    _, version = heads.read(storage)
    families = {
        **head.families,
        "model.ckpt": heads.FamilyState((ten,), ten.key, state.pointer),
    }
    cut = heads.Head(head.seq + 1, head.epoch, head.format, families, head.archives)
    storage.put_if_match("HEAD", cut.to_bytes(), version)
    # node b is the chief now (node rank 0); it has nothing staged
    swapped = [first[1], first[0]]
    for workdir in swapped:
        lcurve = workdir / "lcurve.out"
        if lcurve.exists():
            kept = [
                x
                for x in lcurve.read_text("utf-8").splitlines(keepends=True)
                if x.startswith("#") or int(x.split()[0]) <= 10
            ]
            lcurve.write_text("".join(kept), "utf-8")
    logs = two_nodes(swapped, s3, "--restart", "latest")
    assert "exact resume at step 10" in logs[0]
    continued = {s: r for s, r in rows(swapped[0]).items() if s > 10}
    expected = {s: r for s, r in rows(straight[0]).items() if s > 10}
    assert continued and continued == expected
    head, storage = head_of(s3, url)
    final = head.family("model.ckpt").published
    assert final.step == 20 and final.key.startswith("e000002/")
    a = load_payload(_download(storage, final.key, base / "final_continued.pt"))
    reference = head_of(s3, straight_url)[0].family("model.ckpt").published
    b = load_payload(
        _download(
            head_of(s3, straight_url)[1], reference.key, base / "final_straight.pt"
        )
    )
    for key in ("model",):
        for name, tensor in a[key].items():
            if isinstance(tensor, torch.Tensor):
                assert torch.equal(tensor, b[key][name]), name


def _download(storage, key: str, path: Path) -> Path:
    with open(path, "wb") as sink:
        storage.download(key, sink)
    return path


def test_dp_train_refused_by_a_hostile_lease_holder_says_one_printable_line(
    base, data, s3
):
    """A LEASE whose holder text carries terminal escapes and newlines, renewed
    a moment ago by another host: ``dp train`` is refused in one line, the
    holder shown escaped."""
    import time as _time

    from dp_ckpt_plugin.objectstore.registry import storage_for
    from dp_ckpt_plugin.remote.keys import LEASE_KEY
    from dp_ckpt_plugin.remote.lease import Holder, LeaseState

    url = url_of(s3)
    hostile = "evil\x1b[2J\x1b[31mhost\rERROR forged\nline\u202e"
    holder = Holder(hostile, 4242, hostile, "then")
    state = LeaseState(3, holder, _time.time() + 5, 600.0)
    storage_for(url).put(LEASE_KEY, state.to_bytes())
    workdir = node(base, "hostile_lease", data, url)
    result = run(dp("train", "input.json"), workdir, env=env_of(s3, workdir))
    assert result.returncode != 0
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "ERROR" in line]
    assert len(errors) == 1, result.describe()
    assert "is in use by another run" in errors[0]
    assert "evil\\x1b[2J\\x1b[31mhost\\rERROR forged\\nline\\u202e" in errors[0]
    assert "\x1b" not in result.output and "\r" not in result.output
