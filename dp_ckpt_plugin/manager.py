"""A trainer-neutral front to the store: save, restore, resolve.

::

    from dp_ckpt_plugin import CheckpointManager

    m = CheckpointManager("models", format="hdf5", prefix="model.ckpt", max_keep=5)
    path = m.save(step, state)     # the committed path
    r = m.restore("latest")        # r.step, r.path, r.state
    p = m.resolve("latest")        # the path only, nothing loaded
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import pluggy

from .checkpoint.layout import Family
from .checkpoint.provenance import provenance_of
from .errors import ConfigError
from .objectstore.registry import check_not_mistyped, local_path, remote_url
from .plugin import get_plugin_manager
from .plugin.hooks import Hooks
from .ranks import Ranks, current_ranks, world_size_of
from .resolution import Resolved
from .retention import KeepLast, RetentionPolicy, policy_from_dict
from .storage import Storage
from .store.core import CheckpointStore
from .store.family import FamilyConfig

log = logging.getLogger("dp_ckpt_plugin")


@dataclass
class Restored:
    """A checkpoint read back.

    Attributes
    ----------
    step : int or None
        Its step.
    path : Path
        Its file.
    state : object
        The payload, as the format reads it.
    resolved : Resolved
        How it was found and checked.
    """

    step: int | None
    path: Path
    state: Any
    resolved: Resolved


class CheckpointManager:
    """Save and restore numbered checkpoints in one directory.

    Parameters
    ----------
    directory : str or Path
        The checkpoint directory (``training.save_dir``), or the URL of a
        store on object storage (``s3://bucket/run``, ``gs://``, ``az://``):
        checkpoints are then committed in a local staging directory and
        uploaded in the background (:meth:`wait` waits for the save, not for
        its upload; :meth:`close` waits for the uploads too).
    format : str, optional
        ``"hdf5"`` (NumPy arrays) or ``"torch"``, or a format a plugin adds.
    prefix : str, optional
        File-name prefix of the checkpoints.
    max_keep : int, optional
        How many committed checkpoints to keep; ``0`` keeps all.
    policy : RetentionPolicy or Mapping, optional
        The retention policy, in place of ``max_keep``: a policy object, or
        the plain keys of :func:`~dp_ckpt_plugin.retention.policy_from_dict`
        (``{"keep_last": 5, "keep_best": 3, "best_metric": "loss"}``).
    verify : {"size", "digest"}, optional
        How a checkpoint is checked before it is restored: its size, or also
        its content digest.
    durable : bool, optional
        Whether to fsync (leave on).
    lock : bool, optional
        Whether to refuse a second writer on the same directory.
    async_save : bool, optional
        Whether :meth:`save` returns once a snapshot of the payload is taken
        and writes in a background thread (at most one save in flight; an
        error surfaces at the next save, :meth:`wait` or :meth:`close`).
    writer : {"auto", "process", "thread"}, optional
        Where a background save is serialized and written: ``thread`` (the
        store's own thread), or ``process``, a writer process fed from shared
        memory, for the torch format (the training loop then shares no
        interpreter lock with the write). ``auto`` (the default) is what the
        environment variable ``DP_CKPT_WRITER`` says, else ``thread``; see
        ``docs/performance.md`` for when each costs less.
    pm : pluggy.PluginManager, optional
        The plugin manager; one is built with
        :func:`~dp_ckpt_plugin.plugin.get_plugin_manager` if not given.
    ranks : Ranks, optional
        This process's rank; torch.distributed's if a group is initialized.
    storage : Storage, optional
        How files are touched (the local file system, confined to
        ``directory``, by default).
    staging : str or Path, optional
        With a URL: the folder staging directories go in (``DP_CKPT_STAGING``,
        else the system's temporary directory, by default).
    training_input : Mapping, optional
        The configuration of the run (JSON values): its digest goes into
        every commit record's provenance and it is kept once in
        ``directory/inputs/`` (secret-named keys and URL userinfo removed).
    seed : int, optional
        The run's seed, for the provenance.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        format: str = "hdf5",
        prefix: str = "model.ckpt",
        max_keep: int = 5,
        policy: RetentionPolicy | Mapping[str, Any] | None = None,
        verify: str = "size",
        durable: bool = True,
        lock: bool = True,
        async_save: bool = False,
        pm: pluggy.PluginManager | None = None,
        ranks: Ranks | None = None,
        storage: Storage | None = None,
        writer: str = "auto",
        staging: str | os.PathLike | None = None,
        training_input: Mapping[str, Any] | None = None,
        seed: int | None = None,
        **unknown: object,
    ) -> None:
        for name in unknown:
            if name == "backend":
                raise TypeError("CheckpointManager(backend=) is format= since 0.3")
            raise TypeError(f"CheckpointManager got an unexpected argument {name!r}")
        if verify == "sha256":
            raise ValueError("verify='sha256' is verify='digest' since 0.3")
        if verify not in ("size", "digest"):
            raise ValueError(f"verify must be 'size' or 'digest', got {verify!r}")
        self.pm = pm or get_plugin_manager()
        self.verify = verify
        self.async_save = async_save
        family = Family(prefix, Hooks.of(self.pm).format(format).suffix)
        if policy is None:
            policy = KeepLast(int(max_keep))
        elif isinstance(policy, Mapping):
            policy = policy_from_dict(policy)
        check_not_mistyped(directory)
        root, remote = local_path(directory), None
        if root is None:  # the URL of a remote store
            try:
                url = remote_url(directory)
            except ValueError as exc:
                raise ConfigError(f"{directory}: {exc}") from None
            from .remote.factory import open_remote

            base = Path(os.path.abspath(staging)) if staging is not None else None
            root, remote = open_remote(url, format=format, staging_root=base)
        self.store = CheckpointStore(
            root,
            remote=remote,
            format=format,
            pm=self.pm,
            families=[FamilyConfig(family, policy)],
            ranks=ranks or current_ranks(),
            durable=durable,
            lock=lock,
            storage=storage,
            writer=writer,
        )
        self.store.committer.describe_origin(
            provenance_of(world_size=world_size_of(self.store.ranks), seed=seed),
            training_input,
        )
        if async_save:  # ready (torch imported) by the time the first save comes
            self.store.start_writer()

    directory = property(
        attrgetter("store.directory"),
        doc="The checkpoint directory (the staging directory of a remote store).",
    )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the uploads to a remote store; ``False`` on timeout."""
        return self.store.remote is None or self.store.remote.flush(timeout)

    def save(
        self, step: int, state: Any, *, metrics: Mapping[str, float] | None = None
    ) -> Path:
        """Write and commit the checkpoint of ``step``; return its path.

        ``metrics`` (name to number) go into its commit record, where a
        ``keep_best`` policy ranks by them. With ``async_save``, the path is
        returned once a snapshot is taken; the checkpoint is committed when
        :meth:`wait` returns.
        """
        return self.store.save(step, state, background=self.async_save, metrics=metrics)

    def wait(self) -> None:
        """Wait for a background save; raise its error if it failed."""
        self.store.wait()

    def resolve(self, spec: str = "latest") -> Path:
        """Return the checkpoint ``spec`` names, verified, without loading it."""
        return self._resolve(spec).path

    def restore(self, spec: str = "latest") -> Restored:
        """Resolve ``spec``, verify it and read it back (the file is read once)."""
        found = self._resolve(spec, load=True)
        state = self.store.load(found)
        return Restored(found.step, found.path, state, replace(found, payload=None))

    def _resolve(self, spec: str, *, load: bool = False) -> Resolved:
        self.store.wait()
        found = self.store.resolve(spec, digest=self.verify == "digest", load=load)
        for warning in found.warnings:  # said once, here
            log.warning("%s", warning)
        return found

    def close(self) -> None:
        """Release the directory lock."""
        self.store.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
