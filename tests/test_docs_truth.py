"""The docs say what the code does: defaults, and every sample log line.

Generated from the pages themselves:

- every default the user pages state (the option samples of
  ``docs/options.rst`` and the README, ``(default ...)``, ``(on by
  default)``) is compared with the schema's (:func:`plugin_args`);
- every sample of a line the plugin writes (in a code block, or in
  backticks in the text) is found by what it starts with, and must be a
  line the code renders for the README's scenario (``save_dir: models``,
  ``max_ckpt_keep: 2``, step 20, ...). ``...`` in a sample stands for any
  text; a sample in the text may stop early. A sample that no rendering
  matches fails, so a change of wording in the code fails here until the
  docs follow, and a new sample needs a rendering.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from dp_ckpt_plugin.checkpoint import Checkpoint
from dp_ckpt_plugin.checkpoint.records import CommitRecord
from dp_ckpt_plugin.deepmd.argcheck import PluginOptions, plugin_args, plugin_options
from dp_ckpt_plugin.errors import CheckpointError, ConfigError
from dp_ckpt_plugin.resolution import Resolved

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += sorted((ROOT / "docs").glob("*.rst"))

#: What a line of the plugin's starts with (a sample is recognised by it).
LINE_STARTS = re.compile(
    r"dp_ckpt_plugin \d|--(restart|init-model|finetune) \S+: |saved step \d|"
    r"training ended|SIG[A-Z0-9]+: |adopted \d+ checkpoint|freeze -c \S+: |"
    r"change-bias \S+: |no checkpoint found for restart|archive: \d|"
    r"invalid input at |freezing "
)


def schema_defaults() -> dict:
    found = {a.name: a.default for a in plugin_args().sub_fields.values()}
    found.pop("retention")  # a sub-section, with its own defaults
    remote = plugin_args().sub_fields["remote"]
    found["remote"] = {a.name: a.default for a in remote.sub_fields.values()}
    return found


# -- defaults -----------------------------------------------------------------------


def option_samples():
    """``(page, the _dp_ckpt dict)`` of each sample said to hold every option."""
    readme = (ROOT / "README.md").read_text("utf-8")
    block = re.search(r"```json\n(\{\n  \"training\".*?)```", readme, re.DOTALL)[1]
    yield "README.md", json.loads(block)["training"]["_dp_ckpt"]
    options = (ROOT / "docs" / "options.rst").read_text("utf-8")
    after = options.split("with their default values:", 1)[1]
    block = re.search(r"\.\. code-block:: json\n\n((?:   .*\n|\n)+)", after)[1]
    yield (
        "options.rst",
        json.loads(re.sub(r"^   ", "", block, flags=re.M))["training"]["_dp_ckpt"],
    )


@pytest.mark.parametrize(("page", "sample"), list(option_samples()))
def test_option_samples_hold_every_option_at_its_default(page, sample):
    assert sample == schema_defaults(), page


def stated_defaults():
    """Every ``_dp_ckpt`` default a page states in words, with the page."""
    for page in PAGES:
        text = " ".join(page.read_text("utf-8").split())
        for name, state in re.findall(
            r"`training\._dp_ckpt\.(\w+)`,? \(?(on|off) by default", text
        ):
            yield page.name, name, state == "on"
        for name, value in re.findall(
            r"`training\._dp_ckpt\.(\w+)` \(default ([^;)]+)", text
        ):
            names = re.findall(r"`?\"?(SIG\w+)", value)
            yield page.name, name, names or json.loads(value.strip("` "))
        for name, value in re.findall(
            r"`training\._dp_ckpt\.(\w+): \"(\w+)\"`, the default", text
        ):
            yield page.name, name, value


def test_the_pages_state_defaults():
    assert len(list(stated_defaults())) >= 5


@pytest.mark.parametrize(("page", "name", "value"), list(stated_defaults()))
def test_each_stated_default_is_the_schemas(page, name, value):
    default = schema_defaults()[name]
    assert value == default, f"{page} says the default of {name} is {value!r}"


def test_deepmds_defaults_the_pages_state():
    guarantees = (ROOT / "docs" / "guarantees.md").read_text("utf-8")
    assert "`training.max_ckpt_keep` (default 5)" in guarantees
    assert "`training.save_ckpt` (default `model.ckpt`)" in guarantees
    from dp_ckpt_plugin.deepmd.policy import policy_from_training

    assert policy_from_training({}).count == 5


# -- sample lines -------------------------------------------------------------------


def samples():
    """``(page, text, whole)`` of every sample line: ``whole`` for a code-block line."""
    for page in PAGES:
        text = page.read_text("utf-8")
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
        blocks += re.findall(r"::\n\n((?:   .*\n|\n)+)", text)  # reStructuredText
        for block in blocks:
            for line in block.splitlines():
                line = line.removeprefix("   ")
                if LINE_STARTS.match(line):
                    yield page.name, line, True
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        spans = re.findall(r"``(.+?)``", prose, re.DOTALL)  # may hold a backtick
        prose = re.sub(r"``.+?``", "", prose, flags=re.DOTALL)
        for span in spans + re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            if LINE_STARTS.match(span):
                yield page.name, span, False


def rendered() -> list[str]:
    """The lines the code writes in the README's scenario."""
    from dp_ckpt_plugin.checkpoint.layout import Family
    from dp_ckpt_plugin.deepmd.adopt import adopted_line
    from dp_ckpt_plugin.deepmd.cli import ABORTED, refuse_fallback, stopped_line
    from dp_ckpt_plugin.deepmd.logs import (
        describe_archive,
        finished_line,
        restart_line,
        save_line,
        startup_line,
    )
    from dp_ckpt_plugin.deepmd.preempt import Stopped
    from dp_ckpt_plugin.deepmd.settings import RunSettings
    from dp_ckpt_plugin.deepmd.takeover import unsupported_note
    from dp_ckpt_plugin.resolution import ResolveContext
    from dp_ckpt_plugin.resolution.builtin import resolve

    cwd = Path("/work/run")
    models = cwd / "models"
    settings = RunSettings(
        Path("models"),
        Path("model.ckpt"),
        PluginOptions(),
        {"max_ckpt_keep": 2},
        cwd=cwd,
    )
    record = CommitRecord("model.ckpt-20.pt", 20, "model.ckpt", "torch", 1, "x")
    found = Resolved(
        Checkpoint(models / "model.ckpt-20.pt", 20, "model.ckpt", record),
        "digest",
        "pointer",
        rule="pointer",
        via=models / "checkpoint",
    )
    report = SimpleNamespace(last=(20, models / "model.ckpt-20.pt"))
    store = SimpleNamespace(
        directory=models, primary=Family("model.ckpt", ".pt"), remote=None
    )
    older = SimpleNamespace(
        fell_back=True, step=15, path=models / "model.ckpt-15.pt", warnings=[]
    )
    # the same run with save_dir "s3://bucket/run", staged in /tmp/dp_ckpt-0
    from dp_ckpt_plugin.remote.head import Entry
    from dp_ckpt_plugin.storage.staging import staging_path

    url = "s3://bucket/run"
    staged = staging_path(url, base=Path("/tmp/dp_ckpt-0"))
    remote_settings = RunSettings(
        staged,
        Path("model.ckpt"),
        PluginOptions(),
        {"max_ckpt_keep": 2},
        cwd=cwd,
        save_url=url,
    )
    fetched = Resolved(
        Checkpoint(staged / "model.ckpt-20.pt", 20, "model.ckpt", record),
        "digest",
        f"the latest model.ckpt of HEAD ({url}/e000001/model.ckpt-20.pt)",
        rule="remote",
    )
    uploaded = Entry("e000002/model.ckpt-30.pt", "model.ckpt-30.pt", 30, 1, "x:0")
    remote_store = SimpleNamespace(
        directory=staged,
        primary=Family("model.ckpt", ".pt"),
        remote=SimpleNamespace(
            url=url,
            sent_url=lambda name: (
                f"{url}/{uploaded.key}" if name == uploaded.name else None
            ),
        ),
    )
    remote_report = SimpleNamespace(last=(30, staged / "model.ckpt-30.pt"))
    lines = [
        startup_line(remote_settings, "pt_expt", cwd),
        restart_line("restart", "latest", fetched, cwd),
        finished_line(remote_report, remote_store, cwd),
        startup_line(settings, "pt_expt", cwd),
        startup_line(settings, "pt", cwd),
        restart_line("restart", "latest", found, cwd),
        save_line(
            20, ["models/model.ckpt-20.pt", "model_ema.ckpt-20.pt"], 105_400, 0.021
        ),
        finished_line(report, store, cwd),
        stopped_line(Stopped(signal.SIGTERM, 3127, models / "model.ckpt-3127.pt")),
        ABORTED,
        unsupported_note("3.1.3"),
        adopted_line(4, "models", [15, 20]),
        describe_archive([SimpleNamespace(size=600_000)] * 2, None),
    ]
    for command in ("freeze -c", "change-bias"):
        try:
            refuse_fallback(command, "models", older)
        except CheckpointError as exc:
            lines.append(str(exc).replace(str(cwd) + "/", ""))
    try:
        plugin_options({"training": {"_dp_ckpt": {"verfy": "size"}}})
    except ConfigError as exc:
        lines.append(str(exc))
    context = ResolveContext(Family("model.ckpt", ".pt"), cwd=ROOT / "docs")
    try:
        resolve("lastest", context)
    except CheckpointError as exc:
        lines.append(" ".join(str(exc).split()))
    return [line.replace("/work/run/", "") for line in lines]


def as_pattern(sample: str, whole: bool) -> re.Pattern:
    parts = re.split(r"\.\.\.|…", sample)
    body = ".*?".join(re.escape(p) for p in parts)
    return re.compile(body + ("" if whole else ".*"), re.DOTALL)


SAMPLES = list(samples())


def test_the_pages_hold_samples_of_every_kind_of_line():
    starts = {LINE_STARTS.match(text)[0].split(" ")[0] for _, text, _ in SAMPLES}
    assert {"dp_ckpt_plugin", "--restart", "saved", "training", "SIGTERM:"} <= starts


@pytest.mark.parametrize(
    ("page", "sample", "whole"), SAMPLES, ids=[f"{p}:{s[:40]}" for p, s, _ in SAMPLES]
)
def test_each_sample_line_is_what_the_code_writes(page, sample, whole):
    pattern = as_pattern(sample, whole)
    lines = rendered()
    assert any(pattern.fullmatch(line) for line in lines), (
        f"{page}: no line the code writes matches\n  {sample}\nclosest:\n  "
        + "\n  ".join(sorted(lines, key=lambda line: -_common_prefix(line, sample))[:2])
    )


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
