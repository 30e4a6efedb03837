"""Building the plugin manager.

:func:`get_plugin_manager` is the only place a manager is made: nothing is
registered at import time. It blocks the names listed in
``DP_CKPT_DISABLE_PLUGINS``, loads third-party plugins from the ``dp_ckpt``
entry-point group, registers the built-in plugins (one list of modules, plus
the modules a host asks for, by one mechanism) and checks that every
implementation matches a spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

import pluggy

from .. import hookspecs
from ..blocklist import blocked_names

#: Entry-point group third-party plugins register under.
ENTRY_POINT_GROUP = "dp_ckpt"

#: The core's built-in plugins, name to module, each marked ``trylast``;
#: of two, the one registered first is called first, so ``remote`` (which
#: answers a remote store's specifications) comes before ``best`` (which
#: answers one specification), and both before ``resolve`` (which answers all).
CORE_PLUGINS: Mapping[str, str] = {
    "hdf5": "dp_ckpt_plugin.formats.hdf5",
    "torch": "dp_ckpt_plugin.formats.torch",
    "remote": "dp_ckpt_plugin.remote.resolver",
    "best": "dp_ckpt_plugin.resolution.best",
    "resolve": "dp_ckpt_plugin.resolution.builtin",
}


def get_plugin_manager(
    *,
    host_plugins: Mapping[str, str] | None = None,
    entry_points: bool = True,
    extra: Iterable[object] = (),
) -> pluggy.PluginManager:
    """Build a plugin manager with the built-in and installed plugins.

    Parameters
    ----------
    host_plugins : Mapping[str, str], optional
        Further built-in plugins a host brings (name to module), such as the
        freezer of a deepmd-kit backend.
    entry_points : bool, optional
        Whether to load plugins from the ``dp_ckpt`` entry-point group.
    extra : iterable, optional
        Further plugin objects to register (tests, embedding applications).

    Returns
    -------
    pluggy.PluginManager
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in blocked_names():
        pm.set_blocked(name)
    try:
        if entry_points:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for name, module in {**CORE_PLUGINS, **(host_plugins or {})}.items():
            if not pm.is_blocked(name):
                pm.register(importlib.import_module(module), name=name)
        for plugin in extra:
            pm.register(plugin)
    except pluggy.PluginValidationError as exc:
        if "on_commit(" in str(exc) and "'store'" in str(exc):  # a 0.2 observer
            message = "on_commit(store=) is on_commit(commit=) since 0.3"
            raise pluggy.PluginValidationError(exc.plugin, message) from None
        raise
    pm.check_pending()
    return pm
