"""The lines a ``dp`` command writes about checkpoints (issue 9, item 5)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dp_ckpt_plugin.checkpoint import Checkpoint
from dp_ckpt_plugin.checkpoint.records import CommitRecord
from dp_ckpt_plugin.deepmd.argcheck import PluginOptions
from dp_ckpt_plugin.deepmd.logs import (
    SaveReport,
    ShortPaths,
    describe_how,
    describe_retention,
    human_size,
    restart_line,
    shown,
    startup_line,
)
from dp_ckpt_plugin.deepmd.settings import RunSettings
from dp_ckpt_plugin.resolution import Resolved


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("models", "models"),
        ("run/../t1/models", "t1/models"),
        ("/work/run/./models//a.pt", "models/a.pt"),
        ("/elsewhere/x/../models", "/elsewhere/models"),
        ("..", "/work"),
        (".", "."),
    ],
)
def test_shown_is_normalized_and_short(path, expected):
    assert shown(path, Path("/work/run")) == expected


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ({}, "keep the newest 5"),
        ({"max_ckpt_keep": 0}, "keep all"),
        (
            {"max_ckpt_keep": 2, "enable_ema": True, "ema_ckpt_keep": 1},
            "keep the newest 2 (EMA: 1)",
        ),
        ({"max_ckpt_keep": 2, "ema_ckpt_keep": 1}, "keep the newest 2"),
        ({"ckpt_keep_ratio": 0.5}, "keep the newest 50% of the run's checkpoints"),
    ],
)
def test_retention_in_words(training, expected):
    assert describe_retention(training) == expected


def test_startup_line_without_save_dir_says_what_is_and_is_not_done():
    settings = RunSettings(None, Path("model.ckpt"), PluginOptions(stop_signals=()))
    line = startup_line(settings, "pt", Path("/w"))
    assert "(dp --pt): no save_dir, deepmd-kit's own layout beside model.ckpt" in line
    assert "no stop signals" in line


@pytest.mark.parametrize(
    ("size", "text"), [(12, "12 B"), (80_275, "80.3 kB"), (3.2e9, "3.2 GB")]
)
def test_human_size(size, text):
    assert human_size(size) == text


def resolved(path, how, rule, via, checked="digest", warnings=(), fell_back=False):
    return Resolved(
        Checkpoint(Path(path), 20, "model.ckpt", None),
        checked,
        how,
        list(warnings),
        rule=rule,
        via=Path(via) if via else None,
        fell_back=fell_back,
    )


@pytest.mark.parametrize(
    ("rule", "via", "words"),
    [
        ("pointer", "/w/models/checkpoint", "through the pointer models/checkpoint"),
        ("alias", "/w/model.ckpt.pt", "through the alias model.ckpt.pt"),
        ("link", "/w/model.ckpt.pt", "through the link model.ckpt.pt"),
        ("file", None, "named explicitly"),
        ("newest", "/w/models", "as the newest committed checkpoint in models"),
        ("plugin", None, "what the plugin said"),
    ],
)
def test_how_a_checkpoint_was_found(rule, via, words):
    found = resolved("/w/m.pt", "what the plugin said", rule, via)
    assert describe_how(found, Path("/w")) == words


def test_restart_line_says_what_how_and_why():
    found = resolved(
        "/w/models/model.ckpt-20.pt",
        "newest committed checkpoint in /w/models",
        "newest",
        "/w/models",
        warnings=["falling back from /w/models/model.ckpt-25.pt to ..."],
        fell_back=True,
    )
    line = restart_line("restart", "latest", found, Path("/w"))
    assert line == (
        "--restart latest: models/model.ckpt-20.pt (step 20), as the newest committed "
        "checkpoint in models; size and digest match its commit record; newer "
        "candidates were unusable (see the warnings above)"
    )
    init = restart_line("init-model", "models", found, Path("/w"), archives=True)
    assert "go to save_dir/archive/ at the first save" in init


def committed(path, step, family, size):
    record = CommitRecord(Path(path).name, step, family, "torch", size, "0" * 64)
    return Checkpoint(Path(path), step, family, record)


def test_one_line_per_save_of_every_family(caplog):
    report = SaveReport(Path("/w"))
    report.begin(20, ["model.ckpt", "model_ema.ckpt"], background=False)
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        report.on_commit(
            committed("/w/models/model.ckpt-20.pt", 20, "model.ckpt", 800_000)
        )
        assert caplog.records == [], "a line before every family is committed"
        report.on_commit(
            committed("/w/models/model_ema.ckpt-20.pt", 20, "model_ema.ckpt", 200_000)
        )
        report.on_commit(
            committed("/w/models/other-3.pt", 3, "other", 1)
        )  # not a save of ours
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "saved step 20: models/model.ckpt-20.pt + model_ema.ckpt-20.pt, 1.0 MB in "
    )
    assert line.endswith(" MB/s")
    assert report.last == (20, Path("/w/models/model.ckpt-20.pt"))


def test_background_save_line_says_how_long_training_paused(caplog):
    report = SaveReport(Path("/w"))
    report.begin(5, ["model.ckpt"], background=True)
    report.handed_over(5)
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        report.on_commit(committed("/w/models/model.ckpt-5.pt", 5, "model.ckpt", 10))
    assert " in the background (training paused 0.0" in caplog.records[0].getMessage()


def test_paths_get_short_and_no_line_changes_level(caplog, monkeypatch):
    monkeypatch.chdir("/")
    logger = logging.getLogger("test_host_logs.short")
    logger.addFilter(ShortPaths())
    with caplog.at_level(logging.DEBUG, logger="test_host_logs.short"):
        logger.info("Saved model to models/x.pt")
        logger.info("removed %s (retention)", Path("/tmp/../w/models/model.ckpt-5.pt"))
    saved, removed = caplog.records
    assert saved.levelno == removed.levelno == logging.INFO
    assert saved.getMessage() == "Saved model to models/x.pt"
    assert removed.getMessage() == "removed w/models/model.ckpt-5.pt (retention)"


def test_only_the_plugins_logger_is_filtered():
    """deepmd-kit's lines are never demoted nor changed (issue 36)."""
    from dp_ckpt_plugin.deepmd.host import descriptors
    from dp_ckpt_plugin.deepmd.logs import shorten_paths

    shorten_paths()
    for host in descriptors():
        for name in ("deepmd", host.trainer, host.deepmd_main):
            assert logging.getLogger(name).filters == [], name


@pytest.mark.parametrize(
    ("host", "said"),
    [
        (
            "pt",
            [
                (logging.DEBUG, "Log handles were successfully set"),
                (logging.INFO, "DeePMD version: {version}"),
            ],
        ),
        (
            "pt_expt",
            [(logging.INFO, "DeePMD-kit backend: pt_expt (PyTorch Exportable)")],
        ),
    ],
)
def test_the_lines_of_deepmds_main_are_said(caplog, host, said):
    """What deepmd-kit's ``main`` says before a command, on its own logger."""
    pytest.importorskip("deepmd")
    from deepmd import __version__

    from dp_ckpt_plugin.deepmd.host import descriptor
    from dp_ckpt_plugin.deepmd.logs import say_main_lines

    name = descriptor(host).deepmd_main
    with caplog.at_level(logging.DEBUG, logger=name):
        say_main_lines(host)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (name, level, text.format(version=__version__)) for level, text in said
    ]
