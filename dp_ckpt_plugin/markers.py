"""The hook markers: what makes a function a hook of dp_ckpt_plugin.

The specifications are in :mod:`dp_ckpt_plugin.hookspecs`, which hands these
markers on (``dp_ckpt_plugin.hookimpl`` and ``dp_ckpt_plugin.hookspecs.hookimpl``
are this one). The built-in plugins take them from here, so that a format or
a resolver does not import the hook specifications, which name the types of
every layer.
"""

from __future__ import annotations

import pluggy

#: Project name shared by the hook markers and the plugin manager.
PROJECT = "dp_ckpt"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
