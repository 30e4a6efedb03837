"""The integration's preflight: validate, lock and resolve before anything is built."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import fill_store, needs_torch

from dp_ckpt_plugin import (
    ConfigError,
    RestartNotFoundError,
    StoreLockedError,
)
from dp_ckpt_plugin.lock import StoreLock
from dp_ckpt_plugin.ranks import SingleProcess

pytest.importorskip("deepmd")

from dp_ckpt_plugin.deepmd.prepare import prepare_run


def write_input(tmp_path, **training):
    training = {"save_dir": "models", "numb_steps": 10, **training}
    config = {"training": training, "dp_ckpt": {"verify": "sha256"}}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def run_in(tmp_path, monkeypatch, pm):
    monkeypatch.chdir(tmp_path)

    def run(input_file, **kwargs):
        kwargs.setdefault("restart", None)
        kwargs.setdefault("init_model", None)
        prepared = prepare_run(input_file, pm=pm, ranks=SingleProcess(), **kwargs)
        if prepared.store is not None:
            prepared.store.close()
        return prepared

    return run


@needs_torch
def test_restart_and_init_model_latest_resolve_to_the_store(tmp_path, run_in):
    fill_store(tmp_path / "models", [5, 10], "torch")
    cfg = write_input(tmp_path)
    assert run_in(cfg, restart="latest").restart == str(
        tmp_path / "models" / "model.ckpt-10.pt"
    )
    prepared = run_in(cfg, init_model="latest")
    assert prepared.init_model == str(tmp_path / "models" / "model.ckpt-10.pt")
    assert prepared.resumed_from == tmp_path / "models" / "model.ckpt-10.pt"


@needs_torch
def test_latest_follows_save_ckpt(tmp_path, run_in):
    fill_store(tmp_path / "models", [3], "torch", prefix="run.ckpt")
    cfg = write_input(tmp_path, save_ckpt="run.ckpt")
    assert run_in(cfg, restart="latest").restart.endswith("models/run.ckpt-3.pt")


def test_bad_handle_lists_places(tmp_path, run_in):
    cfg = write_input(tmp_path)
    with pytest.raises(RestartNotFoundError, match="looked at"):
        run_in(cfg, restart="latest")


def test_lock_is_taken_before_anything_is_built(tmp_path, run_in):
    (tmp_path / "models").mkdir()
    holder = StoreLock(tmp_path / "models")
    holder.acquire()
    try:
        with pytest.raises(StoreLockedError, match=f"pid {__import__('os').getpid()}"):
            run_in(write_input(tmp_path))
    finally:
        holder.release()


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"save_dir": 3}, "training.save_dir"),
        ({"save_dir": ""}, "training.save_dir"),
        ({"save_ckpt": "dir/"}, "training.save_ckpt"),
    ],
)
def test_configuration_mistakes(tmp_path, run_in, training, message):
    with pytest.raises(ConfigError, match=message):
        run_in(write_input(tmp_path, **training))


def test_missing_input(tmp_path, run_in):
    with pytest.raises(ConfigError, match="does not exist"):
        run_in(str(tmp_path / "nope.json"))


def test_preflight_imports_no_torch(tmp_path):
    cfg = write_input(tmp_path)
    code = (
        "import sys\n"
        "from dp_ckpt_plugin import get_plugin_manager\n"
        "from dp_ckpt_plugin.ranks import SingleProcess\n"
        "from dp_ckpt_plugin.deepmd.prepare import prepare_run\n"
        f"p = prepare_run({cfg!r}, restart=None, init_model=None, pm=get_plugin_manager(), ranks=SingleProcess())\n"
        "p.store.close()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False", out.stderr
