"""The ``deepmd.backend`` entry point: take over ``dp --pt-expt`` and ``dp --pt``.

deepmd-kit registers its own backends first, then imports every module of the
``deepmd.backend`` entry-point group; its registry lets a later registration of
a key win. Registering a subclass of a backend under each of its keys routes
``dp --pt-expt`` / ``dp --pytorch-exportable`` and ``dp --pt`` / ``dp
--pytorch`` through :func:`dp_ckpt_plugin.deepmd.cli.main`. Every other
property (model file detection, inference, serialization) is inherited
unchanged; ``dp --tf``, ``--jax`` and ``--pd`` are not touched.

Nothing is registered, and deepmd-kit's own backends stay in place, when

- ``DP_CKPT_DISABLE=1`` asks for deepmd-kit's own behaviour, or
- the installed deepmd-kit is not a version the plugin was built for
  (:data:`SUPPORTED`): the plugin overrides deepmd-kit internals, so on
  another version it says so in one line on standard error and stays off.

This module is imported in every process that imports ``deepmd.backend``: it
must stay cheap and must not import torch.
"""

from __future__ import annotations

import functools
import os
import re
import sys

#: Environment variable that turns the plugin off when set to a true value.
PLUGIN_OFF_ENV = "DP_CKPT_DISABLE"
#: What a true value of an environment variable is spelled as.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
#: The deepmd-kit release series (major, minor) the plugin supports.
SUPPORTED = (3, 2)


def disabled() -> bool:
    """Whether ``DP_CKPT_DISABLE`` asks for deepmd-kit's own behaviour."""
    return os.environ.get(PLUGIN_OFF_ENV, "").strip().lower() in TRUE_WORDS


def is_supported(version: str) -> bool:
    """Whether ``version`` (``"3.2.0"``, ``"3.2.1.dev3+g..."``) is a supported series."""
    found = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return found is not None and (int(found[1]), int(found[2])) == SUPPORTED


def unsupported_note(version: str) -> str:
    """The one line said on a deepmd-kit the plugin was not built for."""
    from .. import __version__

    wanted = ".".join(map(str, SUPPORTED))
    return (
        f"dp_ckpt_plugin {__version__} supports deepmd-kit {wanted}.x, found "
        f"{version}: the plugin is off, dp runs as deepmd-kit alone "
        f"(install a deepmd-kit {wanted}.x, or a dp_ckpt_plugin made for {version})"
    )


def _backend_class(host) -> type:
    """A subclass of deepmd-kit's backend whose train and freeze go through ``host``."""
    import importlib

    module, name = host.backend
    base = getattr(importlib.import_module(module), name)

    class CheckpointingBackend(base):
        __doc__ = (
            f"deepmd-kit's {name} with dp_ckpt_plugin's train, freeze and change-bias."
        )

        @property
        def entry_point_hook(self):
            from .cli import main

            return functools.partial(main, host=host.name)

    CheckpointingBackend.__name__ = CheckpointingBackend.__qualname__ = (
        f"Checkpointing{name}"
    )
    return CheckpointingBackend


def _register() -> dict[str, type]:
    """Register every host's backend class under deepmd-kit's keys; return them."""
    from deepmd.backend.backend import Backend

    from .host import descriptors

    registered = {}
    for host in descriptors():
        cls = _backend_class(host)
        for key in host.keys:
            Backend.register(key)(cls)
        registered[host.name] = cls
    return registered


def _take_over() -> dict[str, type]:
    if disabled():
        return {}
    import deepmd

    version = str(getattr(deepmd, "__version__", "unknown"))
    if not is_supported(version):
        print(unsupported_note(version), file=sys.stderr, flush=True)
        return {}
    return _register()


#: The backend classes registered, by host folder (empty when the plugin is off).
BACKENDS = _take_over()
