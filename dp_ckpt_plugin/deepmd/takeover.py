"""The ``deepmd.backend`` entry point: take over ``dp --pt-expt``.

deepmd-kit registers its own backends first, then imports every module of the
``deepmd.backend`` entry-point group; its registry lets a later registration of
a key win. Registering a subclass of the PyTorch-exportable backend under both
of its keys routes ``dp --pt-expt`` and ``dp --pytorch-exportable`` through
:func:`dp_ckpt_plugin.deepmd.cli.main`. Every other property (model file
detection, inference, serialization) is inherited unchanged.

This module is imported in every process that imports ``deepmd.backend``: it
must stay cheap and must not import torch. ``DP_CKPT_DISABLE=1`` leaves
deepmd-kit's own backend in place.
"""

from __future__ import annotations

import os

#: Environment variable that turns the plugin off when set to a true value.
PLUGIN_OFF_ENV = "DP_CKPT_DISABLE"


def disabled() -> bool:
    """Whether ``DP_CKPT_DISABLE`` asks for deepmd-kit's own behaviour."""
    return os.environ.get(PLUGIN_OFF_ENV, "").strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
    }


def _register() -> type | None:
    from deepmd.backend.backend import Backend
    from deepmd.backend.pt_expt import PyTorchExportableBackend

    class CheckpointingPTExptBackend(PyTorchExportableBackend):
        """deepmd-kit's PyTorch-exportable backend with dp_ckpt_plugin's train and freeze."""

        @property
        def entry_point_hook(self):
            from .cli import main

            return main

    for key in ("pt-expt", "pytorch-exportable"):
        Backend.register(key)(CheckpointingPTExptBackend)
    return CheckpointingPTExptBackend


CheckpointingPTExptBackend = None if disabled() else _register()
