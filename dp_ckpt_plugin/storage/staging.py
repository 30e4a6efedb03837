"""Where a remote store is staged on this node.

A run whose ``save_dir`` is a remote store commits each checkpoint into a
local staging directory first. It is node-local by default (under the system's
temporary directory, one folder per user and per store URL), because the
nodes of such a run share no file system; ``DP_CKPT_STAGING`` (or the
``staging_dir`` option) puts it elsewhere, a fast local disk say.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

#: Environment variable naming the folder staging directories go in.
STAGING_ENV = "DP_CKPT_STAGING"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def staging_root() -> Path:
    """The folder this node's staging directories go in."""
    chosen = os.environ.get(STAGING_ENV)
    if chosen:
        return Path(os.path.abspath(chosen))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"dp_ckpt-{uid}"


def staging_dir(
    url: str, *, base: Path | None = None, purpose: str = "staging"
) -> Path:
    """The staging directory of the store at ``url`` (``purpose``: what it holds)."""
    slug = _UNSAFE.sub("_", url.split("://", 1)[-1]).strip("._")[-80:] or "store"
    tag = hashlib.sha256(url.encode("utf-8")).hexdigest()[:8]
    return (base or staging_root()) / purpose / f"{slug}-{tag}"
