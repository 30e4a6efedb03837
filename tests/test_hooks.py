"""The hooks: call order, overriding built-ins, blocking, entry points."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import payload

from dp_ckpt_plugin import (
    CheckpointManager,
    RestartNotFoundError,
    get_plugin_manager,
    hookimpl,
)
from dp_ckpt_plugin.plugins import DISABLE_ENV
from dp_ckpt_plugin.resolve import Resolved


def test_builtins_are_registered_by_name(pm):
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert {"publish", "prune", "resolve", "freeze", "hdf5", "torch"} <= names


def test_hook_call_order_save_commit_publish_observe_prune(tmp_path, pm, monkeypatch):
    calls = []

    class Tracer:
        @hookimpl(hookwrapper=True)
        def on_save_step(self, backend, step):
            calls.append(("save", step))
            yield

        @hookimpl
        def on_commit(self, store, checkpoint):
            # the record exists (committed) and the pointer already moved
            assert (store.directory / f".{checkpoint.path.name}.commit.json").exists()
            calls.append(("observe", checkpoint.step))

    store_cls = __import__(
        "dp_ckpt_plugin.store", fromlist=["CheckpointStore"]
    ).CheckpointStore
    real_publish, real_prune = store_cls.publish, store_cls.prune
    monkeypatch.setattr(
        store_cls,
        "publish",
        lambda s, c: (calls.append(("publish", c.step)), real_publish(s, c))[1],
    )
    monkeypatch.setattr(
        store_cls,
        "prune",
        lambda s, c: (calls.append(("prune", c.step)), real_prune(s, c))[1],
    )
    pm.register(Tracer())
    with CheckpointManager(tmp_path / "m", pm=pm) as m:
        m.save(1, payload(1))
    assert calls == [("save", 1), ("publish", 1), ("observe", 1), ("prune", 1)]


def test_third_party_resolver_overrides_the_builtin(tmp_path, pm, make_manager):
    m = make_manager(max_keep=0)
    m.save(1, payload(1))
    m.save(2, payload(2))

    class PinnedResolver:
        @hookimpl
        def on_resolve_restart(self, spec, context):
            if spec == "first":
                path = context.store_dir / "model.ckpt-1.h5"
                return Resolved(path, 1, None, "unverified", "pinned")
            return None  # let the built-in answer

    pm.register(PinnedResolver())
    assert m.restore("first").step == 1
    assert m.restore("latest").step == 2  # the built-in still answers the rest


def test_third_party_backend(tmp_path, pm):
    import json

    from dp_ckpt_plugin.backends import BackendInfo

    class JsonBackend:
        @hookimpl
        def register_backends(self):
            return [BackendInfo("json", ".json")]

        @hookimpl
        def on_save_step(self, backend, state, file):
            if backend == "json":
                file.write(json.dumps(state).encode())
                return True
            return None

        @hookimpl
        def on_load_step(self, backend, path):
            return json.loads(path.read_text()) if backend == "json" else None

    pm.register(JsonBackend())
    with CheckpointManager(tmp_path / "m", backend="json", pm=pm) as m:
        assert m.save(3, {"a": [1, 2]}).name == "model.ckpt-3.json"
        assert m.restore("latest").state == {"a": [1, 2]}


def test_blocking_a_builtin_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "prune, resolve")
    pm = get_plugin_manager(entry_points=False)
    names = {pm.get_name(p) for p in pm.get_plugins()}
    assert "prune" not in names and "resolve" not in names and "publish" in names
    with CheckpointManager(tmp_path / "m", pm=pm, max_keep=1) as m:
        for step in range(3):
            m.save(step, payload(step))
        # retention is off: all three remain
        assert len(list(m.directory.glob("model.ckpt-*.h5"))) == 3
        with pytest.raises(RestartNotFoundError, match="no plugin resolved"):
            m.resolve("latest")


def test_unknown_backend_is_a_clear_error(tmp_path, pm):
    from dp_ckpt_plugin import ConfigError

    with pytest.raises(
        ConfigError, match="unknown checkpoint backend 'nope'; available: hdf5, torch"
    ):
        CheckpointManager(tmp_path, backend="nope", pm=pm)


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
            def on_commit(store, checkpoint):
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
        m.save(4, payload(4))
    assert sys.modules["ckpt_observer"].COMMITTED == [4]

    monkeypatch.setenv(DISABLE_ENV, "observer")
    assert get_plugin_manager().get_plugin("observer") is None


def test_invalid_hookimpl_is_rejected_at_build_time():
    class Typo:
        @hookimpl
        def on_comit(self, store, checkpoint):
            pass

    from pluggy import PluginValidationError

    with pytest.raises(PluginValidationError):
        get_plugin_manager(entry_points=False, extra=(Typo(),))
