"""What a deepmd-kit trainer tells the store beyond payloads (``deepmd/metrics.py``).

Shared by both hosts: the learning-curve row displayed at a step goes with
that step's periodic save; deepmd-kit's best-validation files become the
``best.ckpt`` / ``best_ema.ckpt`` families of the store. Fakes stand for
deepmd-kit's validator and the store; the real ``dp`` runs are in the e2e
modules.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.deepmd.checkpointing import HostRun
from dp_ckpt_plugin.deepmd.metrics import BEST_FAMILIES, ReportsMetrics


@dataclass
class Record:
    metric: float
    step: int


@dataclass
class Validator:
    """What the hosts read of deepmd-kit's ``FullValidator``."""

    checkpoint_dir: Path
    prefix: str = "best.ckpt"
    save_best: bool = True
    max_best_ckpt: int = 2
    metric_name: str = "e:mae"
    emit_best_save_log: bool = True
    topk_records: list = field(default_factory=list)

    @property
    def best_checkpoint_pattern(self):
        return re.compile(rf"^{re.escape(self.prefix)}-(\d+)\.t-(\d+)\.pt$")


class Store:
    def __init__(self, directory: Path):
        self.directory = directory
        self.primary = Family("model.ckpt", ".pt")
        self.added = []
        self.saved = []

    def add_family(self, cfg):
        self.added.append(cfg)

    def save(self, step, state, *, family, metrics=None):
        self.saved.append((step, family, metrics))
        return self.directory / f"{family}-{step}.pt"


def trainer(tmp_path, *, store=True, ema=False, retention=None):
    class Trainer(ReportsMetrics):
        rank = 0

    t = Trainer()
    t.dp_run = HostRun(Store(tmp_path / "models") if store else None)
    t.dp_run.retention = retention
    t.full_validator = Validator(tmp_path)
    t.ema_full_validator = Validator(tmp_path, "best_ema.ckpt") if ema else None
    return t


def test_the_row_shown_goes_with_the_save_of_its_step(tmp_path):
    t = trainer(tmp_path)
    t.dp_note_shown(10, {"rmse": 1.5, "rmse_e": 0.1}, {"rmse": 2.0})
    assert t.dp_metrics(10) == {"rmse_trn": 1.5, "rmse_e_trn": 0.1, "rmse_val": 2.0}
    assert t.dp_metrics(15) is None  # a save at a step that was not displayed


def test_multi_task_rows_are_named_per_head(tmp_path):
    t = trainer(tmp_path)
    t.dp_note_shown(5, {"h1": {"rmse": 1.0}, "h2": {"rmse": 3.0}}, None)
    assert t.dp_metrics(5) == {"rmse_trn_h1": 1.0, "rmse_trn_h2": 3.0}


def test_without_save_dir_nothing_is_remembered_or_added(tmp_path):
    t = trainer(tmp_path, store=False)
    t.dp_setup_best({}, disp_freq=5, save_freq=5)
    t.dp_note_shown(5, {"rmse": 1.0}, None)
    assert t.dp_metrics(5) is None
    assert t.dp_best_attribute(tmp_path / "best.ckpt-5.t-0.pt") is None


@pytest.mark.parametrize("ema", [False, True])
@pytest.mark.parametrize("save_best_dir", [None, "elsewhere"])
def test_best_files_become_store_families_unless_a_place_is_named(
    tmp_path, ema, save_best_dir
):
    t = trainer(tmp_path, ema=ema)
    validating = {"save_best_dir": save_best_dir} if save_best_dir else {}
    t.dp_setup_best(validating, disp_freq=5, save_freq=5)
    added = [cfg.family.prefix for cfg in t.dp_run.store.added]
    if save_best_dir:
        assert added == []
        assert t.full_validator.emit_best_save_log  # deepmd-kit's own line stays
        return
    assert added == ["best.ckpt", "best_ema.ckpt"][: 1 + ema]
    assert t.dp_run.store.added[0].family.pointer == ("checkpoint.best.ckpt")
    assert not t.full_validator.emit_best_save_log
    for attribute, prefix in list(BEST_FAMILIES.items())[: 1 + ema]:
        name = f"{prefix}-20.t-0.pt"
        assert t.dp_best_attribute(tmp_path / name) == (attribute, 20)
        # deepmd-kit's name elsewhere, or a store name, is not a best file
        assert t.dp_best_attribute(tmp_path / "sub" / name) is None
        assert t.dp_best_attribute(tmp_path / f"{prefix}-20.pt") is None


def test_a_best_file_is_committed_with_its_validation_metric(tmp_path, caplog):
    t = trainer(tmp_path)
    t.dp_setup_best({}, disp_freq=5, save_freq=5)
    t.full_validator.topk_records = [Record(0.08, 5), Record(0.15, 20)]
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        path = t.dp_save_best("full_validator", 20, {"model": {}})
    assert t.dp_run.store.saved == [(20, "best.ckpt", {"e:mae": 0.15})]
    assert path.name == "best.ckpt-20.pt"
    assert "Saved best model to" in caplog.text and "e:mae = 0.15" in caplog.text


@pytest.mark.parametrize(
    ("disp", "save", "warns"), [(5, 10, False), (5, 5, False), (4, 10, True)]
)
def test_keep_best_warns_when_saves_miss_the_displayed_rows(
    tmp_path, caplog, disp, save, warns
):
    t = trainer(tmp_path, retention={"keep_best": 2})
    with caplog.at_level(logging.WARNING, logger="dp_ckpt_plugin"):
        t.dp_setup_best({}, disp_freq=disp, save_freq=save)
    assert ("not a multiple of training.disp_freq" in caplog.text) == warns
