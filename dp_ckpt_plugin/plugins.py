"""Building the plugin manager.

:func:`get_plugin_manager` is the only place a manager is made: nothing is
registered at import time. It blocks the names listed in
``DP_CKPT_DISABLE_PLUGINS``, loads third-party plugins from the ``dp_ckpt``
entry-point group, registers the built-in ones and checks that every
implementation matches a spec.
"""

from __future__ import annotations

import importlib
import os

import pluggy

from . import hookspecs
from .builtin import BUILTINS

#: Environment variable naming plugins (built-in or third-party) to block.
DISABLE_ENV = "DP_CKPT_DISABLE_PLUGINS"
#: Entry-point group third-party plugins register under.
ENTRY_POINT_GROUP = "dp_ckpt"

#: Backend plugins shipped with the package: name to module.
BUILTIN_BACKENDS = {
    "hdf5": "dp_ckpt_plugin.backends.hdf5",
    "torch": "dp_ckpt_plugin.backends.torch",
}


def blocked_names(value: str | None = None) -> list[str]:
    """Parse a comma-separated list of plugin names (the environment's by default)."""
    raw = os.environ.get(DISABLE_ENV, "") if value is None else value
    return [name.strip() for name in raw.split(",") if name.strip()]


def get_plugin_manager(
    *, entry_points: bool = True, extra: tuple = ()
) -> pluggy.PluginManager:
    """Build a plugin manager with the built-in and installed plugins.

    Parameters
    ----------
    entry_points : bool, optional
        Whether to load plugins from the ``dp_ckpt`` entry-point group.
    extra : tuple, optional
        Further plugin objects to register (tests, embedding applications).

    Returns
    -------
    pluggy.PluginManager
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in blocked_names():
        pm.set_blocked(name)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for name, module in BUILTIN_BACKENDS.items():
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(module), name=name)
    if not pm.is_blocked("freeze"):
        from .deepmd.freeze import FreezePTExpt

        pm.register(FreezePTExpt(), name="freeze")
    for name, factory in BUILTINS.items():
        if not pm.is_blocked(name):
            pm.register(factory(), name=name)
    for plugin in extra:
        pm.register(plugin)
    pm.check_pending()
    return pm
