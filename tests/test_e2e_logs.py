"""End to end: with the plugin on, every line of deepmd-kit's log stays, in order (issue 36).

The same tiny input is trained twice, in two working directories: by plain
deepmd-kit (``DP_CKPT_DISABLE=1``) and with the plugin (``dp --pt`` is then
frozen in both, and its log compared the same way). Every line plain
deepmd-kit logs (its version line, the banner, the data summaries, the
per-step lines, ``Saved model to``, the closing lines) must appear in the
plugin's log in the same order, on standard error and in deepmd-kit's log
file (``-l``); the plugin's own lines come in between. Standard output
carries nothing in either run.

Only what legitimately differs between two runs is normalized: the
timestamps, wall-clock times and the ``eta`` clock, and the working
directory (a temporary path). ``dp --pt-expt``'s loss values differ between
two plain runs (plain deepmd-kit makes ``dp_random``, which picks each
batch, from the operating system's entropy; the plugin seeds it, rule 49),
so for that backend only the numbers of the per-step lines are masked;
``dp --pt`` keeps them, exact resume on, and they must match.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    dp,
    dp_env,
    example_config,
    make_data,
    make_workdir,
    run,
)

pytestmark = E2E_MARKS

#: The plugin side's ``training._dp_ckpt.exact_resume``.
EXACT_RESUME = True

#: A tiny run: 4 steps, a line each, a checkpoint every 2.
TRAINING = {"numb_steps": 4, "disp_freq": 1, "save_freq": 2}

_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] ")
_WALL = re.compile(r"(total wall time = )[0-9.]+( s)")
_ETA = re.compile(r"(eta = )\S+ at \d{4}-\d\d-\d\d \d\d:\d\d")
_AVERAGE = re.compile(r"(average training time: )[0-9.]+( s/batch)")
_STEP_LINE = re.compile(r"Batch\s+\d+: (trn|val): ")
_NUMBER = re.compile(r"[-+]?\d+\.\d+(e[-+]\d+)?")


def log_lines(text: str) -> list[str]:
    """The log records of ``text`` (each starts with its timestamp)."""
    return [line for line in text.splitlines() if _STAMP.match(line)]


def normalized(line: str, cwd: Path, *, mask_losses: bool) -> str:
    """``line`` without what differs between two runs of one input."""
    line = _STAMP.sub("", line).replace(str(cwd), "<cwd>")
    line = _WALL.sub(r"\1<s>\2", line)
    line = _ETA.sub(r"\1<eta>", line)
    line = _AVERAGE.sub(r"\1<s>\2", line)
    if mask_losses and _STEP_LINE.search(line):
        line = _NUMBER.sub("<n>", line)
    return line


def missing_in_order(plain: list[str], plugin: list[str]) -> str | None:
    """The first line of ``plain`` not found, in order, in ``plugin``; else ``None``."""
    at = 0
    for index, line in enumerate(plain):
        try:
            at = plugin.index(line, at) + 1
        except ValueError:
            before = "\n".join(plain[max(0, index - 3) : index])
            return f"{line!r} (after:\n{before})"
    return None


def added(plain: list[str], plugin: list[str]) -> list[str]:
    """The lines of ``plugin`` left over once ``plain``'s are matched in order."""
    left, at = list(plugin), 0
    for line in plain:
        at = left.index(line, at)
        del left[at]
    return left


def train(tmp_path: Path, name: str, data: Path, backend: str, **env):
    """``dp --<backend> train input.json -l log.txt`` in a new directory."""
    dp_ckpt = {"exact_resume": EXACT_RESUME} if not env else None
    workdir = make_workdir(
        tmp_path, name, data, example_config(dp_ckpt=dp_ckpt, **TRAINING)
    )
    result = run(
        dp("train", "input.json", "-l", "log.txt", backend=backend),
        workdir,
        env=dp_env(**env),
        label=f"dp --{backend} train ({name})",
    ).check()
    return workdir, result


def lines_of(text: str, cwd: Path, *, mask: bool) -> list[str]:
    """The normalized log records of ``text``, written in ``cwd``."""
    return [normalized(x, cwd, mask_losses=mask) for x in log_lines(text)]


def assert_kept(where: str, theirs: str, ours: str, dirs, *, mask: bool) -> None:
    """Every log line of ``theirs`` (plain) is in ``ours`` (the plugin's), in order."""
    expected = lines_of(theirs, dirs[0], mask=mask)
    assert expected, theirs[-2000:]
    gone = missing_in_order(expected, lines_of(ours, dirs[1], mask=mask))
    assert gone is None, f"{where}: the plugin's log lacks {gone}"


@pytest.mark.parametrize("backend", ["pt", "pt-expt"])
def test_every_line_of_deepmds_log_stays_in_order(tmp_path, backend):
    data = make_data(tmp_path / "data", frames=4)
    plain_dir, plain = train(tmp_path, "plain", data, backend, DP_CKPT_DISABLE="1")
    plugin_dir, plugin = train(tmp_path, "plugin", data, backend)
    dirs, mask = (plain_dir, plugin_dir), backend == "pt-expt"
    files = [(d / "log.txt").read_text("utf-8") for d in dirs]

    assert plain.stdout == plugin.stdout == ""
    assert len(log_lines(plain.stderr)) > 50
    assert_kept("standard error", plain.stderr, plugin.stderr, dirs, mask=mask)
    assert_kept("the log file", *files, dirs, mask=mask)
    # the log file names each line's logger: what the plugin adds is its own
    extra = added(
        *(lines_of(f, d, mask=mask) for f, d in zip(files, dirs, strict=True))
    )
    assert extra and all(" dp_ckpt_plugin " in x for x in extra), extra
    version = "DeePMD version: " if backend == "pt" else "DeePMD-kit backend: pt_expt"
    assert version in log_lines(plugin.stderr)[0]
    assert "Saved model to models/model.ckpt-4.pt" in plugin.stderr
    if backend == "pt":  # freeze too (dp --pt-expt's export takes half a minute)
        frozen = [
            run(dp("freeze", "-o", "frozen.pth", backend=backend), d, env=dp_env(**e))
            for d, e in ((plain_dir, {"DP_CKPT_DISABLE": "1"}), (plugin_dir, {}))
        ]
        for result in frozen:
            result.check()
        assert_kept("freeze", frozen[0].stderr, frozen[1].stderr, dirs, mask=False)
