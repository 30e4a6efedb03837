"""Moving a corrupt checkpoint aside, never deleting it.

A checkpoint of a store that fails verification is moved with its record into
``D/quarantine/``, under a name that never overwrites what the folder already
holds, so a person can still look at it. Only a checkpoint lying in the store
directory itself is moved, and only into a ``quarantine`` folder that is a
directory of the store (not a link): a corrupt file of another directory is
reported and left where it is (rule 31).
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoint.layout import QUARANTINE_DIR
from ..checkpoint.records import record_path
from ..errors import CheckpointWriteError, UnreadableFileError
from ..storage import Storage

if TYPE_CHECKING:
    from . import ResolveContext

log = logging.getLogger("dp_ckpt_plugin")


def quarantine(path: Path, store: Path, *, storage: Storage) -> Path | None:
    """Move a corrupt checkpoint of ``store`` and its record into ``store/quarantine/``.

    Returns the new path, or ``None`` if it was not moved (it lies outside
    the store, ``quarantine`` is not a directory of the store, or the move
    failed); the caller still skips it.
    """
    try:
        if storage.real(path.parent) != storage.real(store):
            return None
        folder = store / QUARANTINE_DIR
        found = storage.entry(folder)
        if found is not None and not found.is_dir:
            log.warning(
                "could not move corrupt %s aside: %s is not a directory of the store",
                path,
                folder,
            )
            return None
        if found is None:
            storage.make_dir(folder, durable=False)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for n in itertools.count():
            dest = folder / f"{path.name}.{stamp}{f'.{n}' if n else ''}"
            record = Path(f"{dest}.commit.json")
            if storage.entry(dest) is None and storage.entry(record) is None:
                break
        storage.rename(path, dest)
        if storage.entry(record_path(path)) is not None:
            storage.rename(record_path(path), record)
    except (CheckpointWriteError, UnreadableFileError) as exc:
        log.warning("could not move corrupt %s aside: %s", path, exc)
        return None
    return dest


def set_aside(
    path: Path, error: Exception, ctx: ResolveContext
) -> tuple[Path | None, str]:
    """Quarantine a corrupt candidate when ``ctx`` allows; where it went, and the warning."""
    moved = None
    if ctx.quarantine and ctx.store_dir is not None:
        moved = quarantine(path, ctx.cwd / ctx.store_dir, storage=ctx.storage)
    return moved, f"{error}; moved aside to {moved}" if moved else str(error)
