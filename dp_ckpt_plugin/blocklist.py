"""The plugins a user turned off: ``DP_CKPT_DISABLE_PLUGINS``.

Read by the plugin manager, which blocks each name before anything is
registered (the plugins offering storages included).
"""

from __future__ import annotations

import os

#: Environment variable naming plugins (built-in or third-party) to block.
BLOCK_PLUGINS_ENV = "DP_CKPT_DISABLE_PLUGINS"


def blocked_names(value: str | None = None) -> list[str]:
    """Parse a comma-separated list of plugin names (the environment's by default)."""
    raw = os.environ.get(BLOCK_PLUGINS_ENV, "") if value is None else value
    return [name.strip() for name in raw.split(",") if name.strip()]
