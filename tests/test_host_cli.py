"""``dp freeze`` and ``dp change-bias`` through the plugin: what a script can rely on.

A freeze or change-bias that could not use what the handle names (the newest
checkpoint is corrupt or not committed, so resolution fell back to an older
one) is refused with one line, unless the older file is named or
``DP_CKPT_ALLOW_FALLBACK=1`` is set. The real ``dp`` runs are in the e2e
modules; here the store is a small one of the ``torch`` format.
"""

from __future__ import annotations

import io
import logging

import pytest
from helpers import fill_store, needs_torch

from dp_ckpt_plugin.errors import CheckpointError
from dp_ckpt_plugin.storage import default_storage

pytest.importorskip("deepmd")

from dp_ckpt_plugin.deepmd.cli import ALLOW_FALLBACK_ENV, refuse_fallback
from dp_ckpt_plugin.deepmd.host import plugin_manager
from dp_ckpt_plugin.deepmd.settings import resolve_for_reading

pytestmark = needs_torch


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ALLOW_FALLBACK_ENV, raising=False)
    fill_store(tmp_path / "models", [5, 10], "torch")
    return tmp_path / "models"


def found_for(spec):
    return resolve_for_reading(plugin_manager("pt"), spec, suffix=".pt")


@pytest.mark.parametrize("spec", ["models", "latest", "models/model.ckpt"])
def test_a_sound_newest_checkpoint_is_used(store, spec):
    if spec == "latest":
        (store.parent / "checkpoint").write_text("models/model.ckpt-10.pt")
    found = found_for(spec)
    assert (found.step, found.fell_back) == (10, False)
    refuse_fallback("freeze -c", spec, found)


@pytest.mark.parametrize("command", ["freeze -c", "change-bias"])
def test_falling_back_past_a_corrupt_newest_is_refused(store, command):
    corrupt(store / "model.ckpt-10.pt")
    found = found_for("models")
    assert (found.step, found.fell_back) == (5, True)
    with pytest.raises(CheckpointError) as info:
        refuse_fallback(command, "models", found)
    message = str(info.value)
    assert message.startswith(f"{command} models: the newest checkpoint")
    assert "models/model.ckpt-5.pt (step 5)" in message
    assert f"{ALLOW_FALLBACK_ENV}=1" in message
    assert "\n" not in message
    # naming the older file is asking for it
    named = found_for("models/model.ckpt-5.pt")
    assert not named.fell_back
    refuse_fallback(command, "models/model.ckpt-5.pt", named)


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_the_environment_allows_the_fallback_with_a_warning(
    store, monkeypatch, caplog, value
):
    corrupt(store / "model.ckpt-10.pt")
    monkeypatch.setenv(ALLOW_FALLBACK_ENV, value)
    with caplog.at_level(logging.WARNING, logger="dp_ckpt_plugin"):
        refuse_fallback("freeze -c", "models", found_for("models"))
    assert "using the older models/model.ckpt-5.pt (step 5)" in caplog.text


def test_an_explicit_no_does_not_allow_it(store, monkeypatch):
    corrupt(store / "model.ckpt-10.pt")
    monkeypatch.setenv(ALLOW_FALLBACK_ENV, "0")
    with pytest.raises(CheckpointError):
        refuse_fallback("freeze -c", "models", found_for("models"))


# -- multi-task checkpoints and --head ----------------------------------------------


def deepmd_like(path, model_params):
    import torch

    torch.save(
        {"model": {"w": torch.ones(2), "_extra_state": {"model_params": model_params}}},
        path,
    )
    return path


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (None, "multi-task checkpoint with the heads head_a, head_b: say which"),
        ("head_c", "--head head_c: .* has no such head; its heads are head_a, head_b"),
    ],
)
def test_a_multi_task_checkpoint_needs_one_of_its_heads(tmp_path, head, message):
    from dp_ckpt_plugin.deepmd.heads import check_head

    path = deepmd_like(tmp_path / "m.pt", {"model_dict": {"head_a": {}, "head_b": {}}})
    payload = default_storage().read_payload(path)
    with pytest.raises(CheckpointError, match=message) as info:
        check_head(payload, head, command="dp --pt-expt freeze -c models")
    assert "\n" not in str(info.value)
    check_head(payload, "head_b", command="dp --pt-expt freeze -c models")


def test_a_single_task_or_unreadable_checkpoint_is_left_to_deepmd(tmp_path):
    from dp_ckpt_plugin.deepmd.heads import check_head, heads_of

    single = default_storage().read_payload(
        deepmd_like(tmp_path / "s.pt", {"descriptor": {}})
    )
    assert heads_of(single.reader()) is None
    check_head(single, None, command="dp --pt freeze")
    assert heads_of(io.BytesIO(b"not a checkpoint")) is None
