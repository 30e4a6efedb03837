"""Moving a corrupt checkpoint aside, never deleting it.

A checkpoint that fails verification is moved with its record into
``quarantine/`` beside it, under a name that never overwrites what the folder
already holds, so a person can still look at it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .layout import QUARANTINE_DIR
from .records import record_path

log = logging.getLogger(__name__)


def quarantine(path: Path) -> Path | None:
    """Move a corrupt checkpoint and its record into ``quarantine/`` beside it.

    Returns the new path, or ``None`` if it could not be moved (the caller
    still skips it).
    """
    folder = path.parent / QUARANTINE_DIR
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = folder / f"{path.name}.{stamp}"
    try:
        folder.mkdir(exist_ok=True)
        n = 0
        while dest.exists() or Path(f"{dest}.commit.json").exists():
            n += 1
            dest = folder / f"{path.name}.{stamp}.{n}"
        os.replace(path, dest)
        rec = record_path(path)
        if rec.exists():
            os.replace(rec, folder / f"{dest.name}.commit.json")
    except OSError as exc:
        log.warning("could not move corrupt %s aside: %s", path, exc.strerror or exc)
        return None
    return dest
