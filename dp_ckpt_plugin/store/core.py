"""The checkpoint store: one directory, its families, and the save line.

A :class:`CheckpointStore` owns one directory ``D``. It holds one or more
families of numbered checkpoints (``D/<prefix>-<step><suffix>``), each with a
latest pointer and alias inside ``D`` and optional mirrors outside it.
:meth:`CheckpointStore.save` runs in a straight line, every step the store's
own (no plugin can skip one):

1. on the first save: create ``D`` (durably), take the lock, sweep leftovers,
   archive an earlier run (:meth:`~CheckpointStore.start_run`);
2. check free space against the size of the family's previous checkpoint;
3. write and commit (:mod:`~dp_ckpt_plugin.store.commit`);
4. publish: pointer, alias and mirrors, all or none
   (:func:`~dp_ckpt_plugin.store.publish.publish`); describe the store in its
   manifest when that changed;
5. call the ``on_commit`` observers (:meth:`~dp_ckpt_plugin.plugin.hooks.Hooks.commit`);
6. apply retention (:func:`~dp_ckpt_plugin.retention.plan_prune`).

Only the chief rank touches the file system, through the store's
:class:`~dp_ckpt_plugin.storage.Storage`, confined to ``D`` and the mirrors.
The store knows no trainer and imports no serialization library.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import pluggy

from ..background.saves import BackgroundWriter
from ..checkpoint import Checkpoint, Commit
from ..checkpoint.catalogue import committed
from ..checkpoint.layout import Family, check_step
from ..checkpoint.manifest import Manifest, describe, describe_store
from ..checkpoint.records import CommitRecord
from ..checkpoint.resume import ResumeState
from ..plugin.hooks import Hooks
from ..ranks import Ranks, SingleProcess
from ..resolution import ResolveContext, Resolved, payload_of, resolve_restart
from ..storage import Storage, local_storage
from ..storage.forks import OwnedLock
from .archive import archive_earlier_run, prune_archives
from .catalogue import Catalogue
from .commit import Committer, serializer
from .family import FamilyConfig
from .lock import StoreLock
from .place import StorePlace
from .pruning import Pruner
from .publish import Publisher
from .replica import Replica
from .sweep import sweep

__all__ = ["CheckpointStore", "FamilyConfig", "check_step"]

log = logging.getLogger("dp_ckpt_plugin")


class CheckpointStore:
    """One checkpoint directory and the families saved in it.

    Saves, resolutions and closing serialize on one mutex: several threads
    (and the background writer) may share one store.

    Parameters
    ----------
    directory : str or Path
        The store directory ``D``; created on the first save.
    format : str
        Name of the serialization format (``"hdf5"``, ``"torch"``, or one a
        plugin registers).
    pm : pluggy.PluginManager or Hooks
        The plugins that serialize, observe and resolve.
    families : iterable of FamilyConfig, optional
        The families; the first is the primary one (the one ``latest`` means).
        Defaults to ``model.ckpt`` keeping 5.
    ranks : Ranks, optional
        Which rank this process is; only rank 0 writes.
    durable : bool, optional
        Whether to fsync files and directories.
    lock : bool, optional
        Whether to hold the single-writer lock while open for writing.
    check_free_space : bool, optional
        Whether to refuse a write when free space is below the size of the
        family's previous checkpoint.
    storage : Storage, optional
        How files are touched; the local file system, confined to ``D`` and
        the families' mirrors, by default.
    max_archives : int, optional
        Keep at most this many archives of earlier runs (``D/archive/<UTC>``):
        at the start of each run, after archiving, older ones are removed
        (never the one holding the checkpoint the run starts from). ``None``
        keeps them all.
    writer : {"auto", "process", "thread"}, optional
        Where background saves are serialized and written: the store's own
        thread, or a writer process fed from shared memory (``process``, torch
        format on the local storage); ``auto`` follows ``DP_CKPT_WRITER``, else
        the thread (``writer_process.uses_process``).
    remote : dp_ckpt_plugin.store.replica.Replica, optional
        The store on object storage this one stages for
        (:func:`dp_ckpt_plugin.remote.factory.open_remote`): ``directory`` is
        then a local staging directory, every committed checkpoint is
        uploaded in the background (:mod:`dp_ckpt_plugin.remote.replica`),
        and restarts read the remote store's HEAD. ``None`` (a local store)
        by default.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        format: str,
        pm: pluggy.PluginManager | Hooks,
        families: Iterable[FamilyConfig] | None = None,
        ranks: Ranks | None = None,
        durable: bool = True,
        lock: bool = True,
        check_free_space: bool = True,
        storage: Storage | None = None,
        max_archives: int | None = None,
        writer: str = "auto",
        remote: Replica | None = None,
    ) -> None:
        directory = Path(os.path.abspath(directory))
        self.remote = remote
        self.max_archives = max_archives
        self.hooks = Hooks.of(pm)
        self.pm = self.hooks.pm
        self.format = self.hooks.format(format)
        default = FamilyConfig(Family("model.ckpt", self.format.suffix))
        configs = list(families) if families is not None else [default]
        if not configs:
            raise ValueError("a store needs at least one family")
        self.families = {c.family.prefix: c for c in configs}
        self.primary = configs[0].family
        self.ranks = ranks or SingleProcess()
        mirrors = [m.path for c in configs for m in c.mirrors]
        storage = storage or local_storage(directory, mirrors=mirrors)
        #: Where the store is, held once and handed to every step of its save line.
        self.place = StorePlace(directory, storage, durable)
        self._lock = StoreLock(directory, storage=storage) if lock else None
        self._ready = self._started = False
        self.resume = ResumeState()
        self.catalogue = Catalogue(self.place, [c.family for c in configs])
        self.committer = Committer(self.catalogue, check_free_space=check_free_space)
        self.publisher = Publisher(self.catalogue)
        uploading = remote.protected if remote is not None else None
        self.pruner = Pruner(self.catalogue, self.resume, uploading)
        self._described: Manifest | None = None
        self._mutex = OwnedLock(f"the checkpoint store of {self.directory}")
        self._background = BackgroundWriter.for_store(self, writer)

    # what the store's place holds, read through it (held nowhere else)
    directory = property(attrgetter("place.directory"), doc="``D``, absolute.")
    storage = property(attrgetter("place.storage"), doc="How files are touched.")
    durable = property(attrgetter("place.durable"), doc="Whether files are fsynced.")

    # -- lifecycle ---------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process writes."""
        return self.ranks.rank == 0

    def open(self) -> None:
        """Create ``D``, take the lock and sweep leftovers (once; chief only)."""
        with self._mutex:
            if self._ready or not self.is_chief:
                return
            self.storage.make_dirs(self.directory, durable=self.durable)
            if self._lock is not None:
                self._lock.acquire()
            mirrors = [m.path for c in self.families.values() for m in c.mirrors]
            families = [c.family for c in self.families.values()]
            sweep(self.directory, families, mirrors, storage=self.storage)
            if self.remote is not None:
                self.remote.start(self)
            self._ready = True

    def start_writer(self) -> None:
        """Start the writer process of background saves now, if there is one."""
        if self.is_chief and self._background.process is not None:
            self._background.process.start()

    def close(self) -> None:
        """Wait for the save in flight, then release the lock (raising its error).

        With a remote store, uploads in flight are waited for (bounded) and
        the remote lease released; what did not make it is said in one line
        and raised as :class:`~dp_ckpt_plugin.errors.CheckpointWriteError`.
        """
        try:
            self._background.shutdown()
        finally:
            with self._mutex:
                try:
                    if self.remote is not None:  # uploads in flight, lease
                        self.remote.finish(self.directory)
                    self.pruner.settle(synced=False)  # the last prune's records
                finally:
                    if self._lock is not None:
                        self._lock.release()
                    self._ready = False

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- families ----------------------------------------------------------
    def family(self, prefix: str | None = None) -> FamilyConfig:
        """Return the configuration of a family (the primary one by default)."""
        return self.families[prefix or self.primary.prefix]

    def add_family(self, config: FamilyConfig) -> None:
        """Add a family (or replace one's configuration) before it is saved.

        For a family a host learns of late (best-validation checkpoints once
        the trainer is built): its leftovers are swept as :meth:`open`
        sweeps the others', and a run resumed from one of its checkpoints
        protects it.
        """
        with self._mutex:
            prefix = config.family.prefix
            if prefix not in self.families:
                self.catalogue.families.append(config.family)
                self.catalogue.invalidate()
                if self._ready:
                    sweep(self.directory, [config.family], storage=self.storage)
            self.families[prefix] = config
            if not self._started:
                self.resume.apply([config.family])

    def path_for(self, step: int, family: str | None = None) -> Path:
        """Return where the checkpoint of ``step`` goes."""
        return self.directory / self.family(family).family.numbered(step)

    # -- saving ------------------------------------------------------------
    def save(
        self,
        step: int,
        state: Any,
        *,
        family: str | None = None,
        background: bool = False,
        metrics: Mapping[str, float] | None = None,
    ) -> Path:
        """Write, commit, publish, observe and retain one checkpoint.

        Returns its path, the same on every rank; see :meth:`save_all`. A
        ``TypeError`` (a step that is no int, a value the format cannot read
        back, naming its key path) comes before any file is created; a
        ``CheckpointWriteError`` names the path and the cause, and leaves the
        previous checkpoint, pointer and alias as they were.
        """
        family = family or self.primary.prefix
        reported = None if metrics is None else {family: metrics}
        return self.save_all(
            step, {family: state}, background=background, metrics=reported
        )[family]

    def save_all(
        self,
        step: int,
        states: dict[str, Any],
        *,
        background: bool = False,
        metrics: Mapping[str, Mapping[str, float]] | None = None,
    ) -> dict[str, Path]:
        """Save one payload per family for ``step`` (periodic and EMA, say).

        Returns the path of each, the same on every rank. ``metrics`` maps a
        family to what its checkpoint's record carries (for ``keep_best``).
        With ``background``, the call returns once a consistent snapshot of
        the payloads is taken; the rest runs on the background writer (one
        save in flight; an error surfaces once, at the next save,
        :meth:`wait` or :meth:`close`).
        """
        step = check_step(step)
        paths = {family: self.path_for(step, family) for family in states}
        if not self.is_chief:
            return paths
        if self.format.check is not None:
            for state in states.values():
                self.format.check(state)
        reported = self.committer.check_saves(step, paths, self.format.name, metrics)
        if not background:
            self.wait()
            self._save_states(step, states, paths, reported)  # overlapped
            return paths
        self.open()  # the lock is taken (or refused) now, not on the worker

        def snapshot() -> tuple:
            taken = {f: self._background.take(step, s) for f, s in states.items()}
            return step, taken, paths, reported, False

        self._background.submit(snapshot, self._save_states)
        return paths

    def wait(self) -> None:
        """Wait for the background save in flight; raise its error if it failed."""
        self._background.wait()

    def _save_states(self, step, states, paths, metrics, overlap=True) -> None:
        """Save every family's payload of ``step``, holding the mutex.

        ``overlap``: whether the commit and publication run their fsyncs at
        once on threads of their own (a save on the caller's thread); a
        background save runs them one after the other on the worker, where
        handing work to more threads beside a training loop holding the
        interpreter lock cost more than it saved (docs/performance.md).
        """
        with self._mutex:
            if self.remote is not None:
                self.remote.check()  # a run fenced off stops here, with one line
            saved = [
                self._save(step, s, f, paths[f], metrics, overlap)
                for f, s in states.items()
            ]
            if self.remote is not None:
                self.remote.submit(saved)

    def _save(
        self, step: int, state: Any, family: str, path: Path, metrics, overlap: bool
    ):
        """The straight line of :meth:`save`, on the chief, holding the mutex.

        Returns the family's configuration and the checkpoint committed
        (``metrics``: of every family; ``overlap``: see :meth:`_save_states`).
        """
        cfg = self.family(family)
        self.open()
        self.start_run()
        fam = cfg.family
        epoch = self.remote.epoch if self.remote is not None else None
        record = self.committer.commit(
            path,
            serializer(self.hooks, self.format.name, step, state),
            step=step,
            family=fam,
            format=self.format.name,
            metrics=metrics.get(fam.prefix),
            lineage=self.resume.lineage(fam, epoch),
            overlap=overlap,
        )
        checkpoint = Checkpoint(path, step, fam.prefix, self.resume.made(fam, record))
        self.catalogue.add(fam, checkpoint)
        published = self.publisher.publish(cfg, checkpoint, overlap=overlap)
        families = [(c.family, c.policy) for c in self.families.values()]
        manifest = describe(self.format.name, families)
        self._described = describe_store(
            self.directory, manifest, self._described, self.storage
        )
        fams = tuple(self.families)
        self.hooks.commit(
            Commit(checkpoint, self.directory, self.format.name, published, fams)
        )
        self.prune(checkpoint)
        return cfg, checkpoint

    def start_run(self) -> Path | None:
        """Archive what an earlier run left, once, before this run's first save.

        A run that continues from a checkpoint inside ``D`` archives the
        checkpoints numbered above it; any other run archives every committed
        checkpoint of its families, with their pointers and aliases (rule 14).
        Returns the archive folder, or ``None`` when nothing was moved.
        """
        if self._started or not self.is_chief:
            return None
        self._started = True
        dest, doomed = archive_earlier_run(self.catalogue, self.resume.continues_from)
        if dest is not None:
            self.resume.moved([c.name for c in doomed], dest)
        if self.remote is not None:
            self.remote.start_run()
        spare = {p.parent for p in self.resume.paths()}
        prune_archives(
            self.directory, self.max_archives, self.storage, spare, self.durable
        )
        return dest

    def prune(self, checkpoint: Checkpoint) -> list[Path]:
        """Apply retention after ``checkpoint`` was committed and published."""
        return self.pruner.prune(self.family(checkpoint.family), checkpoint)

    # -- resolution and loading ----------------------------------------------
    def context(
        self,
        *,
        digest: bool = False,
        cwd: Path | None = None,
        family: str | None = None,
        load: bool = False,
    ) -> ResolveContext:
        """Return the resolution context of this store."""
        return ResolveContext.of_store(
            self, digest=digest, cwd=cwd, family=family, load=load
        )

    def resolve(
        self,
        spec: str,
        *,
        digest: bool = False,
        cwd: Path | None = None,
        continues: bool = True,
        load: bool = False,
        context: ResolveContext | None = None,
    ) -> Resolved:
        """Resolve a restart specification (on the chief, broadcast to all).

        The checkpoint found is protected from retention until this run
        commits one of a later step (see :meth:`protect_resumed`); one
        moved into quarantine on the way leaves the catalogue. ``load``
        keeps its verified bytes for :meth:`load` (:attr:`Resolved.payload`).
        A host with a context of its own (fallback pointers, a family read
        from a directory) passes ``context``; it is read with this store's
        storage and remote (the chief's), and ``digest``, ``cwd`` and
        ``load`` are then its own.
        """
        with self._mutex:
            if self.remote is not None:
                self.open()  # a remote store's HEAD is fenced before latest is read
            ctx = context or self.context(digest=digest, cwd=cwd, load=load)
            src = None if self.remote is None else self.remote.source(self)
            ctx = replace(ctx, storage=self.storage, verifier=None, remote=src)
            found = resolve_restart(self.hooks, spec, ctx, self.ranks)
            if self.remote is not None:
                found = self.remote.staged(found, self, continues=continues)
            for moved in found.moved_aside:  # corrupt files went to quarantine
                for cfg in self.families.values():
                    self.catalogue.discard(cfg.family, moved.name)
            self.protect_resumed(found.path, continues=continues, record=found.record)
            return found

    def protect_resumed(
        self, path: Path, *, continues: bool = True, record: CommitRecord | None = None
    ) -> None:
        """Note the checkpoint this run starts from; keep it out of retention.

        Only a checkpoint of ``D`` counts. ``continues`` says whether the run
        goes on from its step (a restart) or starts its own count (an
        initialization): only the first keeps ``D``'s checkpoints up to that
        step in place (rule 14). ``record``: its commit record, as resolved
        (the lineage the run's checkpoints continue).
        """
        families = [c.family for c in self.families.values()]
        self.resume.start_from(path, self.place, families, continues, record)

    def load(self, resolved: Resolved) -> Any:
        """Read a resolved checkpoint through its format, from its verified bytes.

        The bytes the front door kept (``resolve(..., load=True)``), else the
        file read once now and checked at the level it was resolved with.
        """
        name = resolved.record.format if resolved.record else self.format.name
        payload = payload_of(resolved, self.storage)
        return self.hooks.load_step(name, resolved.path, payload.reader())

    def committed(self, family: str | None = None) -> list[Checkpoint]:
        """Return the committed checkpoints of a family, oldest first."""
        return committed(
            self.directory, self.family(family).family, storage=self.storage
        )
