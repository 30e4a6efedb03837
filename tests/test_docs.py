"""The documentation builds, lists every option and hook, and its examples run."""

from __future__ import annotations

import ast
import dataclasses
import functools
import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import make_arrays, make_payload, open_manager, payload_mismatches

from dp_ckpt_plugin import hookspecs
from dp_ckpt_plugin.blocklist import BLOCK_PLUGINS_ENV
from dp_ckpt_plugin.deepmd.argcheck import PluginOptions, check_save_dir, plugin_options
from dp_ckpt_plugin.errors import (
    ConfigError,
    CorruptCheckpointError,
    RestartNotFoundError,
)
from dp_ckpt_plugin.plugin import CORE_PLUGINS, ENTRY_POINT_GROUP

DOCS = Path(__file__).resolve().parents[1] / "docs"
TESTS = Path(__file__).resolve().parent
HOOKS = sorted(
    name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "dp_ckpt_spec")
)


def load_example(name: str):
    """Import ``docs/examples/<name>.py`` as a fresh module."""
    path = DOCS / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_text(path: Path) -> str:
    """The visible text of an HTML page, whitespace collapsed."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", path.read_text("utf-8")))
    return " ".join(text.split())


# -- building -------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build the HTML docs once, nitpicky, warnings as errors; return the output folder."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path_factory.mktemp("docs")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going"]
    cmd += ["-q"]
    cmd += ["-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "html"


def test_options_page_lists_every_option(built):
    text = page_text(built / "options.html")
    for field in dataclasses.fields(PluginOptions):
        assert f"_dp_ckpt/{field.name}" in text, field.name
    assert "save_dir" in text


def test_api_page_documents_every_public_name(built):
    import dp_ckpt_plugin

    page = (built / "api.html").read_text("utf-8")
    for name, module in dp_ckpt_plugin._EXPORTS.items():
        assert f'id="dp_ckpt_plugin.{module}.{name}"' in page, name


def test_hooks_page_covers_every_hook_and_example(built):
    text = page_text(built / "hooks.html")
    for hook in HOOKS:
        assert hook in text
    assert "class CommitLog" in text
    assert "def on_resolve_restart" in text


# -- sources ---------------------------------------------------------------------


def test_hooks_doc_has_one_section_per_hook():
    source = (DOCS / "hooks.md").read_text("utf-8")
    headings = re.findall(r"^### `(\w+)`$", source, flags=re.MULTILINE)
    assert sorted(headings) == HOOKS


def test_hooks_doc_names_builtins_entry_points_and_switch():
    source = (DOCS / "hooks.md").read_text("utf-8")
    for name in CORE_PLUGINS:
        assert f"| `{name}` |" in source, name
    assert BLOCK_PLUGINS_ENV in source
    assert f"[project.entry-points.{ENTRY_POINT_GROUP}]" in source


def test_documented_error_message_is_the_real_one():
    with pytest.raises(ConfigError) as info:
        plugin_options({"training": {"_dp_ckpt": {"verfy": "size"}}})
    assert str(info.value) in (DOCS / "options.rst").read_text("utf-8")


def json_snippets() -> list[str]:
    """The JSON code blocks of every page."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        found += re.findall(r"```json\n(.*?)```", path.read_text("utf-8"), re.DOTALL)
    for path in sorted(DOCS.glob("*.rst")):
        text = path.read_text("utf-8")
        for block in re.findall(r"\.\. code-block:: json\n\n((?:   .*\n|\n)+)", text):
            found.append(re.sub(r"^   ", "", block, flags=re.MULTILINE))
    return found


def test_json_snippets_are_valid_inputs(tmp_path, monkeypatch):
    snippets = json_snippets()
    assert len(snippets) >= 2
    monkeypatch.chdir(tmp_path)
    for snippet in snippets:
        config = json.loads(snippet)
        plugin_options(config)
        check_save_dir(config.get("training", {}).get("save_dir"))


# -- the guarantees and the test map ------------------------------------------------

#: The pages written for users: they say what is promised, in plain words.
USER_PAGES = [
    DOCS.parent / "README.md",
    DOCS / "guarantees.md",
    DOCS / "options.rst",
    DOCS / "command.md",
    DOCS / "hooks.md",
    DOCS / "index.md",
]
#: What a user page never says: text the user cannot see, or a test's name
#: (``TEST_WORKERS``, the test script's variable, is no test's name).
NOT_FOR_USERS = re.compile(
    r"shared\s+contract|shared\s+text|\b(?!(?-i:TEST_WORKERS)\b)test_\w+(?![\w.])",
    flags=re.IGNORECASE,
)


def rule_numbers(path: Path) -> list[int]:
    """The numbers of a page's top-level numbered items (``12. ...``), in order."""
    text = path.read_text("utf-8")
    return [int(n) for n in re.findall(r"^(\d+)\. ", text, flags=re.MULTILINE)]


@functools.cache
def functions_defined(path: Path) -> frozenset[str]:
    """The names of the functions a Python file defines, at any depth."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def test_guarantees_and_test_map_number_the_same_rules():
    rules = rule_numbers(DOCS / "guarantees.md")
    assert len(rules) >= 34
    assert rules == list(range(1, len(rules) + 1)), "one list, numbered 1, 2, 3, ..."
    assert rule_numbers(DOCS / "test-map.md") == rules


def test_every_test_the_map_names_exists():
    text = (DOCS / "test-map.md").read_text("utf-8")
    named = set(re.findall(r"\b(test_\w+\.py)::(\w+)", text))
    assert len(named) > 100
    missing = sorted(
        f"{file}::{function}"
        for file, function in named
        if not (TESTS / file).is_file()
        or function not in functions_defined(TESTS / file)
    )
    assert missing == []
    files = set(re.findall(r"\b(test_\w+\.py)\b", text))
    assert sorted(f for f in files if not (TESTS / f).is_file()) == []


def test_user_pages_name_no_test_and_no_text_users_cannot_see():
    found = []
    for page in USER_PAGES:
        text = page.read_text("utf-8")
        found += [
            f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
            for m in NOT_FOR_USERS.finditer(text)
        ]
    assert found == []


def test_the_checks_see_what_they_look_for():
    """The user-page pattern catches each kind of mistake (so it can fail)."""
    for text in (
        "as the shared\ncontract says",
        "the Shared Text",
        "held by `test_store.py::test_commit_record_fields`",
        "see test_commit_record_fields",
    ):
        assert NOT_FOR_USERS.search(text), text
    for text in (
        "bash scripts/test.sh",
        "the test map",
        "docs/test-map.md",
        "`TEST_WORKERS=0`",
    ):
        assert not NOT_FOR_USERS.search(text), text
    assert NOT_FOR_USERS.search("test_workers_leave_the_stop_signals_to_the_trainer")
    assert NOT_FOR_USERS.search("TEST_WORKERS_X")


# -- the examples -----------------------------------------------------------------


def test_commit_log_records_each_commit_before_pruning(tmp_path):
    log = load_example("commit_log").CommitLog()
    seen_while_committing = []

    class Spy:
        @hookspecs.hookimpl
        def on_commit(self, commit, checkpoint):
            seen_while_committing.append(
                sorted(p.name for p in commit.directory.glob("model.ckpt-*.h5"))
            )

    m = open_manager(tmp_path / "models", plugins=(log, Spy()), max_keep=2)
    try:
        paths = [m.save(step, make_payload(step)) for step in range(4)]
    finally:
        m.close()
    assert log.committed == list(enumerate(paths))
    assert all(p.parent == tmp_path / "models" for p in paths)
    # the observer runs before the built-in pruner: three files at step 2
    assert len(seen_while_committing[2]) == 3
    assert sorted(p.name for p in (tmp_path / "models").glob("model.ckpt-*.h5")) == [
        "model.ckpt-2.h5",
        "model.ckpt-3.h5",
    ]


def test_restart_by_step(tmp_path):
    plugin = load_example("restart_by_step")
    m = open_manager(
        tmp_path / "models", plugins=(plugin,), max_keep=0, verify="digest"
    )
    try:
        paths = [m.save(step, make_payload(step)) for step in range(4)]
        restored = m.restore("step:1")
        assert restored.step == 1
        assert restored.path == paths[1]
        assert restored.resolved.checked == "digest"
        assert payload_mismatches(restored.state, 1) == []
        # other specs still reach the built-in resolver
        assert m.resolve("latest") == paths[3]
        for spec in ("step:9", "step:x"):
            with pytest.raises(RestartNotFoundError, match=spec):
                m.resolve(spec)
    finally:
        m.close()


def test_restart_by_step_verifies_the_file(tmp_path):
    plugin = load_example("restart_by_step")
    m = open_manager(tmp_path / "models", plugins=(plugin,), max_keep=0)
    try:
        paths = [m.save(step, make_payload(step)) for step in range(3)]
        with open(paths[1], "r+b") as handle:
            handle.truncate(10)
        with pytest.raises(CorruptCheckpointError, match=r"model\.ckpt-1\.h5"):
            m.resolve("step:1")
    finally:
        m.close()


def test_npz_format_round_trip(tmp_path):
    plugin = load_example("npz_format")
    m = open_manager(tmp_path / "models", "npz", plugins=(plugin,), max_keep=2)
    try:
        for step in range(3):
            path = m.save(step, make_arrays(step))
        assert path.name == "model.ckpt-2.npz"
        restored = m.restore("latest")
    finally:
        m.close()
    assert restored.step == 2
    for key, value in make_arrays(2).items():
        np.testing.assert_array_equal(restored.state[key], value)


def test_freeze_npz_exports_hdf5_checkpoints(tmp_path):
    plugin = load_example("freeze_npz")
    m = open_manager(tmp_path / "models", plugins=(plugin,))
    try:
        m.save(7, make_payload(7))
        resolved = m.store.resolve("latest")
        output = tmp_path / "frozen.npz"
        answer = m.pm.hook.on_freeze(
            checkpoint=resolved, output=str(output), options={}
        )
    finally:
        m.close()
    assert answer == str(output)
    with np.load(output) as frozen:
        for key, value in make_arrays(7).items():
            np.testing.assert_array_equal(frozen[key], value)


def test_freeze_npz_leaves_other_checkpoints_alone(tmp_path):
    plugin = load_example("freeze_npz")
    npz = load_example("npz_format")
    m = open_manager(tmp_path / "models", "npz", plugins=(npz,))
    try:
        m.save(1, make_arrays(1))
        resolved = m.store.resolve("latest")
    finally:
        m.close()
    output = tmp_path / "frozen.npz"
    assert plugin.on_freeze(checkpoint=resolved, output=str(output), options={}) is None
    assert not output.exists()
