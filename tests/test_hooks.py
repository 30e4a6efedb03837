"""The hooks: call order, overriding built-ins, blocking, entry points."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from helpers import make_payload

from dp_ckpt_plugin import (
    Checkpoint,
    CheckpointManager,
    RestartNotFoundError,
    get_plugin_manager,
    hookimpl,
)
from dp_ckpt_plugin.blocklist import BLOCK_PLUGINS_ENV
from dp_ckpt_plugin.resolution import Resolved


def test_builtins_are_registered_by_name(pm):
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert names == {"resolve", "best", "remote", "hdf5", "torch"}


def test_hosts_add_their_plugins_by_module_name():
    pm = get_plugin_manager(
        entry_points=False,
        host_plugins={"freeze": "dp_ckpt_plugin.deepmd.pt_expt.freeze"},
    )
    assert pm.get_plugin("freeze") is not None


def test_hook_call_order_save_commit_publish_observe_prune(tmp_path, pm):
    """The store's straight line, as an observer sees the directory at each hook."""
    seen = []

    class Observer:
        @hookimpl(hookwrapper=True)
        def on_save_step(self, format, step, file):
            seen.append(("write", step, sorted(os.listdir(tmp_path / "m"))))
            yield

        @hookimpl
        def on_commit(self, commit, checkpoint):
            d = commit.directory
            seen.append(
                (
                    "observe",
                    checkpoint.step,
                    checkpoint.committed,
                    (d / "checkpoint").read_text().strip(),
                    sorted(p.name for p in d.glob("model.ckpt-*.h5")),
                )
            )

    pm.register(Observer())
    with CheckpointManager(tmp_path / "m", pm=pm, max_keep=1) as m:
        m.save(1, make_payload(1))
        m.save(2, make_payload(2))
        # after save returned, retention has removed step 1
        assert sorted(p.name for p in m.directory.glob("model.ckpt-*.h5")) == [
            "model.ckpt-2.h5"
        ]
    assert [s[:2] for s in seen] == [
        ("write", 1),
        ("observe", 1),
        ("write", 2),
        ("observe", 2),
    ]
    # the payload of step 2 is written before its name exists
    assert "model.ckpt-2.h5" not in seen[2][2]
    # observers see it committed and published, and retention not yet applied
    assert seen[3][2:] == (
        True,
        "model.ckpt-2.h5",
        ["model.ckpt-1.h5", "model.ckpt-2.h5"],
    )


def test_a_failing_observer_skips_nothing(tmp_path, pm, caplog):
    """Other observers still run, the save returns, publication and retention hold."""
    later = []

    class Broken:
        @hookimpl(tryfirst=True)
        def on_commit(self, checkpoint):
            raise RuntimeError("mirror disk is full")

    class Recorder:
        @hookimpl
        def on_commit(self, checkpoint):
            later.append(checkpoint.step)

    pm.register(Recorder())
    pm.register(Broken(), name="broken-mirror")
    with CheckpointManager(tmp_path / "m", pm=pm, max_keep=1) as m:
        m.save(1, make_payload(1))
        path = m.save(2, make_payload(2))
        assert path.name == "model.ckpt-2.h5"
        assert (m.directory / "checkpoint").read_text().strip() == path.name
        assert sorted(p.name for p in m.directory.glob("model.ckpt-*.h5")) == [
            path.name
        ]
    assert later == [1, 2]
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        "'broken-mirror' failed" in msg and "mirror disk is full" in msg
        for msg in messages
    ), messages


def test_third_party_resolver_overrides_the_builtin(tmp_path, pm, make_manager):
    m = make_manager(max_keep=0)
    m.save(1, make_payload(1))
    m.save(2, make_payload(2))

    class PinnedResolver:
        @hookimpl
        def on_resolve_restart(self, spec, context):
            if spec == "first":
                path = context.store_dir / "model.ckpt-1.h5"
                return Resolved(Checkpoint(path, 1, None), "unverified", "pinned")
            return None  # let the built-in answer

    pm.register(PinnedResolver())
    assert m.restore("first").step == 1
    assert m.restore("latest").step == 2  # the built-in still answers the rest


def test_third_party_format(tmp_path, pm):
    import json

    from dp_ckpt_plugin.formats import FormatInfo

    class JsonBackend:
        @hookimpl
        def register_formats(self):
            return [FormatInfo("json", ".json")]

        @hookimpl
        def on_save_step(self, format, state, file):
            if format == "json":
                file.write(json.dumps(state).encode())
                return True
            return None

        @hookimpl
        def on_load_step(self, format, path):
            return json.loads(path.read_text()) if format == "json" else None

    pm.register(JsonBackend())
    with CheckpointManager(tmp_path / "m", format="json", pm=pm) as m:
        assert m.save(3, {"a": [1, 2]}).name == "model.ckpt-3.json"
        assert m.restore("latest").state == {"a": [1, 2]}


def test_blocking_a_builtin_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(BLOCK_PLUGINS_ENV, "publish, prune, resolve")
    pm = get_plugin_manager(entry_points=False)
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert "resolve" not in names and "hdf5" in names
    with CheckpointManager(tmp_path / "m", pm=pm, max_keep=1) as m:
        for step in range(3):
            m.save(step, make_payload(step))
        # publication and retention are the store's own: no block list skips them
        assert [p.name for p in m.directory.glob("model.ckpt-*.h5")] == [
            "model.ckpt-2.h5"
        ]
        assert (m.directory / "checkpoint").read_text() == "model.ckpt-2.h5"
        with pytest.raises(RestartNotFoundError, match="no plugin resolved"):
            m.resolve("latest")


def test_unknown_backend_is_a_clear_error(tmp_path, pm):
    from dp_ckpt_plugin import ConfigError

    with pytest.raises(
        ConfigError, match="unknown checkpoint format 'nope'; available: hdf5, torch"
    ):
        CheckpointManager(tmp_path, format="nope", pm=pm)


def test_entry_point_plugin_is_loaded_and_can_be_blocked(tmp_path, monkeypatch):
    """A real installed distribution with a ``dp_ckpt`` entry point."""
    site = tmp_path / "site"
    pkg = site / "ckpt_observer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from dp_ckpt_plugin import hookimpl

            COMMITTED = []

            @hookimpl
            def on_commit(commit, checkpoint):
                COMMITTED.append(checkpoint.step)
            """
        )
    )
    dist = site / "ckpt_observer-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ckpt-observer\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[dp_ckpt]\nobserver = ckpt_observer\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "ckpt_observer", raising=False)

    pm = get_plugin_manager()
    assert pm.get_plugin("observer") is not None
    with CheckpointManager(tmp_path / "m", pm=pm) as m:
        m.save(4, make_payload(4))
    assert sys.modules["ckpt_observer"].COMMITTED == [4]

    monkeypatch.setenv(BLOCK_PLUGINS_ENV, "observer")
    assert get_plugin_manager().get_plugin("observer") is None


def test_an_observer_of_0_2_is_refused_in_one_line_naming_commit():
    class Observer:
        @hookimpl
        def on_commit(self, store, checkpoint):
            pass

    from pluggy import PluginValidationError

    with pytest.raises(PluginValidationError) as caught:
        get_plugin_manager(entry_points=False, extra=[Observer()])
    assert str(caught.value) == "on_commit(store=) is on_commit(commit=) since 0.3"


def test_invalid_hookimpl_is_rejected_at_build_time():
    class Typo:
        @hookimpl
        def on_comit(self, store, checkpoint):
            pass

    from pluggy import PluginValidationError

    with pytest.raises(PluginValidationError):
        get_plugin_manager(entry_points=False, extra=(Typo(),))
