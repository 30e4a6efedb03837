"""dp-ckpt-backup: copy every committed checkpoint to a second place, restart from it.

An example of a third-party dp_ckpt_plugin plugin (see ``README.md``). Two
hooks:

- ``on_commit``: copy the checkpoint, then its commit record, into
  ``$DP_CKPT_BACKUP_DIR/<store directory name>/``; each through a temporary
  name, fsynced and moved into place, and the copy checked against the record
  before the record is copied: a copy without a record never counts, as in
  the store itself.
- ``on_resolve_restart``: ``backup`` names the newest committed copy of the
  store being resolved (``backup:<name>``: of the store called ``<name>``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dp_ckpt_plugin import RestartNotFoundError, hookimpl, resolve
from dp_ckpt_plugin.checkpoint.records import record_path, verify

#: Environment variable naming the backup directory; unset, the plugin is off.
ENV = "DP_CKPT_BACKUP_DIR"
#: The restart specification this plugin answers.
SPEC = "backup"


def backup_root() -> Path | None:
    """The backup directory, or ``None`` when backups are off."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def copy_atomic(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary name, durably.

    The copy is fsynced before it takes its name, and the directory after:
    a crash leaves the old ``target`` or the new one, never half of it.
    """
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(source, "rb") as handle, open(temporary, "wb") as out:
            shutil.copyfileobj(handle, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    finally:
        if temporary.exists():
            temporary.unlink()
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@hookimpl
def on_commit(commit, checkpoint):
    """Copy a committed checkpoint and its record into the backup directory."""
    root = backup_root()
    if root is None:
        return
    folder = root / commit.directory.name
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / checkpoint.name
    copy_atomic(checkpoint.path, copy)
    verify(copy, checkpoint.record, digest=True)  # raises: the store logs it
    copy_atomic(record_path(checkpoint.path), record_path(copy))


@hookimpl
def on_resolve_restart(spec, context):
    """Resolve ``backup`` and ``backup:<name>``; leave every other spec."""
    if spec != SPEC and not spec.startswith(f"{SPEC}:"):
        return None
    root = backup_root()
    if root is None:
        raise RestartNotFoundError(f"restart {spec!r}: {ENV} is not set")
    name = spec[len(SPEC) + 1 :]
    if not name:
        store = context.store_dir or context.cwd
        name = Path(os.path.abspath(context.cwd / store)).name
    folder = root / name
    if not folder.is_dir():
        raise RestartNotFoundError(f"restart {spec!r}: there is no backup {folder}")
    return resolve(str(folder), context)
