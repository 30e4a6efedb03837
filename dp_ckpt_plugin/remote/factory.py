"""The one place a remote-backed store is put together: :func:`open_remote`.

``dp train`` (``deepmd.prepare.build_store``), the
:class:`~dp_ckpt_plugin.manager.CheckpointManager` and ``dp-ckpt sync`` all
call it: the URL's storage comes from the registry, the local directory is
the URL's private staging directory unless the caller has one, and the
:class:`~dp_ckpt_plugin.remote.replica.RemoteStore` returned is what a
:class:`~dp_ckpt_plugin.store.core.CheckpointStore` takes as its ``remote``.
"""

from __future__ import annotations

from pathlib import Path

from ..objectstore.registry import storage_for
from ..storage import Storage
from ..storage.staging import staging_dir
from .lease import DEFAULT_TTL
from .replica import DEFAULT_UPLOAD_WAIT, RemoteStore


def open_remote(
    url: str,
    *,
    format: str,
    directory: Path | None = None,
    staging_root: Path | None = None,
    local: Storage | None = None,
    ttl: float = DEFAULT_TTL,
    upload_wait: float = DEFAULT_UPLOAD_WAIT,
) -> tuple[Path, RemoteStore]:
    """The local directory staging for the store at ``url``, and its writer side.

    ``directory``: that directory, when the caller chose it (a run's
    settings, the directory ``dp-ckpt sync`` sends); else the staging
    directory of ``url`` under ``staging_root`` (the default root when
    ``None``), checked private and made if missing. ``local``: the storage
    staged files are read with, for a writer no store is given to (a store
    hands it its own when it starts it).

    Raises
    ------
    ConfigError
        For a URL no storage serves, or a staging folder that is not private.
    """
    if directory is None:
        directory = staging_dir(url, base=staging_root)
    remote = RemoteStore(
        storage_for(url), format=format, staging=local, ttl=ttl, upload_wait=upload_wait
    )
    return directory, remote
