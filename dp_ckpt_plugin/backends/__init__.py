"""Serialization backends.

A backend only turns a payload into bytes in an open file and back
(:func:`~dp_ckpt_plugin.hookspecs.on_save_step`,
:func:`~dp_ckpt_plugin.hookspecs.on_load_step`). Names, commit, publication and
retention belong to the store. Backends declare themselves through
:func:`~dp_ckpt_plugin.hookspecs.register_backends`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pluggy

from ..errors import ConfigError


@dataclass(frozen=True)
class BackendInfo:
    """A serialization backend as the store knows it.

    Attributes
    ----------
    name : str
        The name users pass as ``backend=``.
    suffix : str
        File suffix of its checkpoints, with the dot.
    description : str
        One line for listings and errors.
    """

    name: str
    suffix: str
    description: str = ""


def available_backends(pm: pluggy.PluginManager) -> dict[str, BackendInfo]:
    """Return every registered backend by name."""
    found: dict[str, BackendInfo] = {}
    for infos in pm.hook.register_backends():
        for info in infos or ():
            found.setdefault(info.name, info)
    return found


def get_backend(pm: pluggy.PluginManager, name: str) -> BackendInfo:
    """Return the backend called ``name`` or raise a :class:`ConfigError`."""
    backends = available_backends(pm)
    try:
        return backends[name]
    except KeyError:
        known = ", ".join(sorted(backends)) or "none"
        raise ConfigError(
            f"unknown checkpoint backend {name!r}; available: {known}"
        ) from None
