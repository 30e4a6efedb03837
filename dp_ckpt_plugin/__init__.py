"""dp_ckpt_plugin: crash-safe, self-contained checkpoints for DeePMD-kit.

Importing this package imports neither torch nor deepmd-kit.
"""

from __future__ import annotations

from .errors import (
    CheckpointError,
    CheckpointWriteError,
    ConfigError,
    CorruptCheckpointError,
    RestartNotFoundError,
    StoreLockedError,
    UnsafePointerError,
)
from .hookspecs import hookimpl
from .manager import CheckpointManager, Restored
from .plugins import get_plugin_manager
from .store import Checkpoint, CheckpointStore, FamilyConfig

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointStore",
    "CheckpointWriteError",
    "ConfigError",
    "CorruptCheckpointError",
    "FamilyConfig",
    "RestartNotFoundError",
    "Restored",
    "StoreLockedError",
    "UnsafePointerError",
    "__version__",
    "get_plugin_manager",
    "hookimpl",
]
