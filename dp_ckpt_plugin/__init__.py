"""dp_ckpt_plugin: crash-safe, self-contained checkpoints for DeePMD-kit.

Importing this package imports nothing heavy: the public names below are
loaded on first use, so the ``deepmd.backend`` entry point that every ``dp``
process loads (:mod:`dp_ckpt_plugin.deepmd.takeover`) costs next to nothing, and
torch, h5py and deepmd-kit are imported only when a checkpoint is written or read.
"""

from __future__ import annotations

import importlib
from typing import Any

from .text import guard_logger

__version__ = "0.3.0"

guard_logger()

#: Public name -> module that defines it.
_EXPORTS = {
    "CheckpointError": "errors",
    "CheckpointWriteError": "errors",
    "ConfigError": "errors",
    "CorruptCheckpointError": "errors",
    "InvalidRecordError": "errors",
    "RestartNotFoundError": "errors",
    "StoreLockedError": "errors",
    "UnsafePointerError": "errors",
    "UnreadableFileError": "errors",
    "Commit": "checkpoint",
    "Hooks": "plugin.hooks",
    "Storage": "storage",
    "hookimpl": "hookspecs",
    "CheckpointManager": "manager",
    "Restored": "manager",
    "get_plugin_manager": "plugin",
    "Checkpoint": "checkpoint",
    "CommitRecord": "checkpoint.records",
    "CheckpointStore": "store.core",
    "FamilyConfig": "store.family",
    "Family": "checkpoint.layout",
    "FormatInfo": "formats",
    "Mirror": "store.publish",
    "ResolveContext": "resolution",
    "Resolved": "resolution",
    "resolve": "resolution.builtin",
    "resolve_restart": "resolution",
    "AnyOf": "retention",
    "KeepAll": "retention",
    "KeepBest": "retention",
    "KeepEveryNSteps": "retention",
    "KeepLast": "retention",
    "RetentionPolicy": "retention",
    "explain_prune": "retention",
    "policy_from_dict": "retention",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dp_ckpt_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
