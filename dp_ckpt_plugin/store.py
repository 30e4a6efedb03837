"""The checkpoint store: one directory, its families, and the save line.

A :class:`CheckpointStore` owns one directory ``D``. It holds one or more
families of numbered checkpoints (``D/<prefix>-<step><suffix>``), each with a
latest pointer and alias inside ``D`` and optional mirrors outside it.
:meth:`CheckpointStore.save` runs in a straight line:

1. on the first save: create ``D`` (durably), take the lock, sweep leftovers,
   archive an earlier run (:meth:`CheckpointStore.start_run`);
2. check free space against the size of the family's previous checkpoint;
3. write and commit (:mod:`~dp_ckpt_plugin.commit`): the payload
   (``on_save_step``) to a temporary name, fsynced and hashed; the commit
   record, durably; the payload moved into place, ``D`` fsynced. A step this
   run saved already is rewritten so that the old or the new checkpoint is
   committed at every instant; a file this run did not write is archived,
   never overwritten;
4. publish: pointer, alias and mirrors, all or none
   (:func:`~dp_ckpt_plugin.publish.publish`), naming the checkpoint just
   written, or for a family ranked by a metric (its policy is a
   :class:`~dp_ckpt_plugin.retention.KeepBest`) the best one; describe the
   store in its manifest (:mod:`~dp_ckpt_plugin.manifest`) when that changed;
5. call the ``on_commit`` observers;
6. apply retention (:func:`~dp_ckpt_plugin.retention.plan_prune`).

Steps 1-4 and 6 are the store's own; no plugin can skip them. Only the chief
rank touches the filesystem; other ranks get the same path back. The store
knows no trainer and imports no serialization library: formats do.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import fsio
from .archive import archive, archive_earlier_run
from .background import BackgroundWriter
from .catalogue import Catalogue, committed, read_record_or_none
from .checkpoint import Checkpoint
from .commit import remove, rewrite, write_new
from .errors import CheckpointWriteError, RestartNotFoundError
from .formats import FormatInfo, get_format
from .layout import Family
from .lock import StoreLock
from .manifest import Manifest, describe, write_manifest
from .pointers import read_link_or_none, read_text_or_none
from .publish import Mirror, publish
from .ranks import Ranks, SingleProcess
from .records import check_metrics
from .resolution import ResolveContext, Resolved, resolve_restart
from .retention import Candidate, KeepBest, KeepLast, RetentionPolicy, plan_prune
from .sweep import sweep

log = logging.getLogger("dp_ckpt_plugin")

#: Headroom asked for beyond the previous checkpoint's size before a write.
SPACE_HEADROOM = 1.05


@dataclass
class FamilyConfig:
    """How a store treats one family.

    Attributes
    ----------
    family : Family
        Names of the family.
    policy : RetentionPolicy
        Which committed checkpoints to keep.
    mirrors : tuple of Mirror
        Pointers and aliases outside the store to keep up to date too (a
        host's compatibility files), each holding a path relative to its own
        directory. Pointer mirrors are also where ``latest`` looks when the
        store itself names nothing.
    """

    family: Family
    policy: RetentionPolicy = field(default_factory=lambda: KeepLast(5))
    mirrors: tuple[Mirror, ...] = ()


class CheckpointStore:
    """One checkpoint directory and the families saved in it.

    Parameters
    ----------
    directory : str or Path
        The store directory ``D``; created on the first save.
    format : str
        Name of the serialization format (``"hdf5"``, ``"torch"``, or one a
        plugin registers).
    pm : pluggy.PluginManager
        The plugin manager whose hooks serialize, observe and resolve.
    families : iterable of FamilyConfig, optional
        The families; the first is the primary one (the one ``latest`` means).
        Defaults to ``model.ckpt`` keeping 5.
    ranks : Ranks, optional
        Which rank this process is; only rank 0 writes.
    durable : bool, optional
        Whether to fsync files and directories (turn off only for tests of
        other things).
    lock : bool, optional
        Whether to hold the single-writer lock while the store is open for
        writing.
    check_free_space : bool, optional
        Whether to refuse a write when free space is below the size of the
        family's previous checkpoint.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        format: str,
        pm: pluggy.PluginManager,
        families: Iterable[FamilyConfig] | None = None,
        ranks: Ranks | None = None,
        durable: bool = True,
        lock: bool = True,
        check_free_space: bool = True,
    ) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.pm = pm
        self.format: FormatInfo = get_format(pm, format)
        configs = (
            list(families)
            if families is not None
            else [FamilyConfig(Family("model.ckpt", self.format.suffix))]
        )
        if not configs:
            raise ValueError("a store needs at least one family")
        self.families: dict[str, FamilyConfig] = {c.family.prefix: c for c in configs}
        self.primary = configs[0].family
        self.ranks = ranks or SingleProcess()
        self.durable = durable
        self.check_free_space = check_free_space
        self._lock = StoreLock(self.directory) if lock else None
        self._ready = False
        self._resumed_from: dict[str, Path] = {}
        self._continues_from: Path | None = None
        self._resumed: tuple[Path, bool] | None = None
        self._started = False
        self._written: set[str] = set()
        self.catalogue = Catalogue(self.directory, [c.family for c in configs])
        self._last_size: dict[str, int] = {}
        self._manifest: Manifest | None = None
        # saves, resolutions and closing serialize: several threads (and the
        # background writer) may share one store
        self._mutex = threading.RLock()
        self._background = BackgroundWriter()

    # -- lifecycle ---------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process writes."""
        return self.ranks.rank == 0

    def open(self) -> None:
        """Create ``D``, take the lock and sweep leftovers.

        Called by the first save; idempotent. Only the chief does anything.
        """
        if self._ready or not self.is_chief:
            return
        try:
            fsio.make_dirs(self.directory, durable=self.durable)
        except OSError as exc:
            raise CheckpointWriteError(
                f"cannot create checkpoint directory {self.directory}: {exc.strerror or exc}"
            ) from exc
        if self._lock is not None:
            self._lock.acquire()
        mirrors = [m.path for cfg in self.families.values() for m in cfg.mirrors]
        families = [cfg.family for cfg in self.families.values()]
        sweep(self.directory, families, mirrors)
        self._ready = True

    def close(self) -> None:
        """Wait for the save in flight, then release the lock.

        Raises the error of the save in flight, if it failed, after releasing.
        """
        try:
            self._background.shutdown()
        finally:
            self._release()

    def _release(self) -> None:
        with self._mutex:
            if self._lock is not None:
                self._lock.release()
            self._ready = False

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- saving ------------------------------------------------------------
    def family(self, prefix: str | None = None) -> FamilyConfig:
        """Return the configuration of a family (the primary one by default)."""
        return self.families[prefix or self.primary.prefix]

    def add_family(self, config: FamilyConfig) -> None:
        """Add a family (or replace one's configuration) before it is saved.

        For a family a host learns of late, such as best-validation
        checkpoints once the trainer is built. On an open store the family's
        leftovers are swept as :meth:`open` sweeps the others'; a run that
        resumed from a checkpoint of the family (``--restart best``) is
        protected as :meth:`protect_resumed` protects it.
        """
        with self._mutex:
            prefix = config.family.prefix
            if prefix not in self.families:
                self.catalogue.families.append(config.family)
                self.catalogue.invalidate()
                if self._ready:
                    sweep(self.directory, [config.family])
            self.families[prefix] = config
            if self._resumed is not None and not self._started:
                self.protect_resumed(self._resumed[0], continues=self._resumed[1])

    def path_for(self, step: int, family: str | None = None) -> Path:
        """Return where the checkpoint of ``step`` goes."""
        return self.directory / self.family(family).family.numbered(step)

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

        Returns its path, the same on every rank; only the chief writes.
        With ``background``, see :meth:`save_all`. ``metrics`` (name to
        number, such as a validation error) go into the commit record, where
        :class:`~dp_ckpt_plugin.retention.KeepBest` reads them.

        Raises
        ------
        TypeError
            When ``step`` is not an int, or the payload holds a value the
            format cannot read back exactly (naming its key path); nothing
            is created.
        CheckpointWriteError
            Naming the path and the cause. Temporary files are removed and
            the previous checkpoint, pointer and alias are untouched.
        """
        family = family or self.primary.prefix
        return self.save_all(
            step,
            {family: state},
            background=background,
            metrics=None if metrics is None else {family: metrics},
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
        family to the metrics of its checkpoint (see :meth:`save`).

        With ``background``, the call returns once a consistent snapshot of
        the payloads is taken (:class:`~dp_ckpt_plugin.snapshot.Snapshotter`):
        write, commit, publication, observers and retention run in a
        background thread. At most one save is in flight: a new save first
        waits for the previous one, and raises its error if it failed, so an
        error surfaces at the next save or at :meth:`wait` / :meth:`close`,
        never silently.
        """
        step = check_step(step)
        paths = {family: self.path_for(step, family) for family in states}
        if not self.is_chief:
            return paths
        if self.format.check is not None:
            for state in states.values():
                self.format.check(state)
        reported = {f: check_metrics(m) for f, m in (metrics or {}).items()}
        if not background:
            self.wait()
            self._save_states(step, states, paths, reported)
            return paths
        self.wait()
        with self._mutex:
            self.open()  # the lock is taken (or refused) now, not on the worker
        snapshots = {f: self._background.snapshots.take(s) for f, s in states.items()}
        self._background.submit(self._save_states, step, snapshots, paths, reported)
        return paths

    def _save_states(self, step, states, paths, metrics) -> None:
        with self._mutex:
            for family, state in states.items():
                self._save(
                    step, state, self.family(family), paths[family], metrics.get(family)
                )

    def wait(self) -> None:
        """Wait for the background save in flight; raise its error if it failed."""
        self._background.wait()

    def _save(
        self,
        step: int,
        state: Any,
        cfg: FamilyConfig,
        path: Path,
        metrics: dict[str, float | None] | None = None,
    ) -> Path:
        """The straight line of :meth:`save`, on the chief, holding the mutex."""
        self.open()
        self.start_run()
        self._check_space(cfg.family, path)
        record = self._write(step, state, cfg.family, path, metrics)
        self._written.add(path.name)
        self.catalogue.add(
            cfg.family, Checkpoint(path, step, cfg.family.prefix, record)
        )
        self._last_size[cfg.family.prefix] = record.size
        checkpoint = Checkpoint(path, step, cfg.family.prefix, record)
        published = self.leader(cfg, step) or path
        publish(published, self.publication_targets(cfg), durable=self.durable)
        log.info("committed %s (step %d)", path, step)
        self._describe()
        self._notify(checkpoint)
        for removed in self.prune(checkpoint):
            log.info("removed %s (retention)", removed)
        return path

    def _write(self, step: int, state: Any, family: Family, path: Path, metrics):
        """Write and commit ``path``; never overwrite what this run did not write."""

        def serialize(handle):
            self._serialize(step, state, handle)

        details = {
            "step": step,
            "family": family.prefix,
            "format": self.format.name,
            "durable": self.durable,
        }
        if metrics is not None:  # a save without metrics calls as it always did
            details["metrics"] = metrics
        if os.path.lexists(path):
            old = read_record_or_none(path)
            if old is not None and path.name in self._written:
                return rewrite(path, serialize, old=old, **details)
            # an earlier run's checkpoint, or a file that is not ours: keep it
            dest = archive(
                self.directory,
                [Checkpoint(path, step, family.prefix, old)],
                durable=self.durable,
            )
            self.catalogue.discard(family, path.name)
            log.info("moved %s, written before this run, to %s", path, dest)
        return write_new(path, serialize, **details)

    def start_run(self) -> Path | None:
        """Archive what an earlier run left, once, before this run's first save.

        A run that continues from a checkpoint inside ``D`` (see
        :meth:`protect_resumed`) archives the checkpoints numbered above it;
        any other run archives every committed checkpoint of its families,
        with their pointers and aliases (rule 14). Returns the archive folder,
        or ``None`` when nothing was moved.
        """
        if self._started or not self.is_chief:
            return None
        self._started = True
        dest, doomed = archive_earlier_run(
            self.directory,
            self.catalogue,
            self._continues_from,
            durable=self.durable,
        )
        names = {c.name for c in doomed}
        if dest is not None:
            steps = sorted({c.step for c in doomed})
            log.info(
                "archived %d checkpoint(s) of an earlier run (steps %s) to %s",
                len(doomed),
                ", ".join(map(str, steps)),
                dest,
            )
            for prefix, path in list(self._resumed_from.items()):
                if path.name in names:
                    self._resumed_from[prefix] = dest / path.name
        return dest

    def _serialize(self, step: int, state: Any, handle) -> None:
        written = self.pm.hook.on_save_step(
            format=self.format.name, step=step, state=state, file=handle
        )
        if written is None:
            raise CheckpointWriteError(
                f"no plugin serialized format {self.format.name!r}"
            )

    def _check_space(self, family: Family, path: Path) -> None:
        if not self.check_free_space:
            return
        size = self._last_size.get(family.prefix)
        if size is None:
            newest = self.catalogue.newest(family)
            size = newest.record.size if newest else None
        if size is None:
            return
        free = fsio.free_bytes(self.directory)
        need = int(size * SPACE_HEADROOM)
        if free is not None and free < need:
            raise CheckpointWriteError(
                f"could not write {path}: not enough space ({free} bytes free, "
                f"the previous checkpoint took {size})"
            )

    # -- publication, observers, retention -----------------------------------
    def publication_targets(self, cfg: FamilyConfig) -> list[Mirror]:
        """The family's in-store pointer and alias, then its mirrors (no repeats)."""
        targets = [
            Mirror(self.directory / cfg.family.pointer, "pointer"),
            Mirror(self.directory / cfg.family.alias, "alias"),
            *cfg.mirrors,
        ]
        seen: set[Path] = set()
        unique = []
        for target in targets:
            if target.path not in seen:
                seen.add(target.path)
                unique.append(target)
        return unique

    def _notify(self, checkpoint: Checkpoint) -> None:
        """Call every ``on_commit`` observer; one that raises is logged, not fatal."""
        given = {"store": self, "checkpoint": checkpoint}
        for impl in reversed(self.pm.hook.on_commit.get_hookimpls()):
            try:
                impl.function(*[given[name] for name in impl.argnames])
            except Exception as exc:
                log.warning(
                    "on_commit observer %r failed for %s: %s: %s",
                    impl.plugin_name,
                    checkpoint.path,
                    type(exc).__name__,
                    exc,
                )

    def candidates(self, family: Family, up_to: int | None = None) -> list[Candidate]:
        """The family's committed checkpoints as retention sees them, oldest first."""
        return [
            Candidate(c.name, c.step, c.record.metrics)
            for c in sorted(self.catalogue.of(family).values(), key=_by_step)
            if up_to is None or c.step <= up_to
        ]

    def leader(self, cfg: FamilyConfig, step: int) -> Path | None:
        """The best checkpoint up to ``step`` of a family ranked by a metric.

        A family is ranked when its policy is a
        :class:`~dp_ckpt_plugin.retention.KeepBest` alone (a family of best
        checkpoints); ``keep_best`` beside a window only keeps more files, and
        the newest stays published. ``None`` when the family is not ranked,
        or no checkpoint carries the metric: the checkpoint just written is
        published then.
        """
        if not isinstance(cfg.policy, KeepBest):
            return None
        ranked = cfg.policy.rank(self.candidates(cfg.family, up_to=step))
        return self.directory / ranked[0].name if ranked else None

    def _describe(self) -> None:
        """Write the store's manifest if what it says changed; never fatal."""
        manifest = describe(
            self.format.name, [(c.family, c.policy) for c in self.families.values()]
        )
        if manifest == self._manifest:
            return
        try:
            # informative, like the lock's holder note: no fsync
            write_manifest(self.directory, manifest, durable=False)
        except OSError as exc:
            log.warning("could not describe the store in %s: %s", self.directory, exc)
            return
        self._manifest = manifest

    def protected(self, family: Family, current: Path | None = None) -> set[str]:
        """Names retention must not remove in ``family``."""
        names = set()
        if current is not None:
            names.add(current.name)
        pointed = read_text_or_none(self.directory / family.pointer)
        if pointed and pointed.strip():
            names.add(Path(pointed.strip()).name)
        linked = read_link_or_none(self.directory / family.alias)
        if linked:
            names.add(Path(linked).name)
        resumed = self._resumed_from.get(family.prefix)
        if resumed is not None:
            names.add(resumed.name)
        return names

    def prune(self, checkpoint: Checkpoint) -> list[Path]:
        """Apply retention after ``checkpoint`` was committed and published."""
        cfg = self.family(checkpoint.family)
        fam = cfg.family
        resumed = self._resumed_from.get(fam.prefix)
        if resumed is not None and checkpoint.step >= (fam.step_of(resumed.name) or 0):
            del self._resumed_from[fam.prefix]
        entries = self.catalogue.of(fam)
        keeps_all = getattr(cfg.policy, "keeps_all", None)
        if keeps_all is not None and keeps_all(len(entries)):
            return []  # nothing to plan: the policy keeps a family this size whole
        doomed = plan_prune(
            {c.name: c.step for c in entries.values()},
            current_step=checkpoint.step,
            protected=self.protected(fam, checkpoint.path),
            policy=cfg.policy,
            metrics={c.name: c.record.metrics or {} for c in entries.values()},
        )
        paths = [self.directory / name for name in doomed]
        try:
            remove(paths, durable=self.durable)
        finally:  # a failed removal leaves its checkpoint in the catalogue
            for path in paths:
                if not os.path.lexists(path):
                    self.catalogue.discard(fam, path.name)
        return paths

    # -- resolution and loading ----------------------------------------------
    def context(
        self,
        *,
        digest: bool = False,
        cwd: Path | None = None,
        family: str | None = None,
    ) -> ResolveContext:
        """Return the resolution context of this store."""
        cfg = self.family(family)
        return ResolveContext(
            family=cfg.family,
            store_dir=self.directory,
            cwd=cwd or Path.cwd(),
            fallback_pointers=tuple(m.path for m in cfg.mirrors if m.kind == "pointer"),
            digest=digest,
            quarantine=self.is_chief,
        )

    def resolve(
        self, spec: str, *, digest: bool = False, cwd: Path | None = None
    ) -> Resolved:
        """Resolve a restart specification (on the chief, broadcast to all).

        The checkpoint found becomes protected from retention until this run
        commits one of a later step.
        """
        with self._mutex:
            ctx = self.context(digest=digest, cwd=cwd) if self.is_chief else None
            found = resolve_restart(self.pm, spec, ctx, self.ranks)
            for moved in found.moved_aside:  # corrupt files went to quarantine
                for cfg in self.families.values():
                    self.catalogue.discard(cfg.family, moved.name)
            self.protect_resumed(found.path)
            return found

    def protect_resumed(self, path: Path, *, continues: bool = True) -> None:
        """Note the checkpoint this run starts from; keep it out of retention.

        The protection lasts until this store commits a checkpoint of a later
        step of the same family. ``continues`` says whether the run goes on
        from that checkpoint's step (a restart) or starts its own count (an
        initialization): only a run that continues from a checkpoint inside
        ``D`` keeps ``D``'s checkpoints up to that step in place (rule 14).
        """
        path = Path(path)
        if path.parent.resolve() != self.directory.resolve():
            return
        self._resumed = (path, continues)  # again for a family added later
        for prefix, cfg in self.families.items():
            if cfg.family.step_of(path.name) is not None:
                self._resumed_from[prefix] = path
                if continues:
                    self._continues_from = path

    def load(self, resolved: Resolved) -> Any:
        """Read a resolved checkpoint through its format."""
        name = resolved.record.format if resolved.record else self.format.name
        state = self.pm.hook.on_load_step(format=name, path=resolved.path)
        if state is None:
            raise RestartNotFoundError(
                f"no plugin reads format {name!r} (checkpoint {resolved.path})"
            )
        return state

    def committed(self, family: str | None = None) -> list[Checkpoint]:
        """Return the committed checkpoints of a family, oldest first."""
        return committed(self.directory, self.family(family).family)


def check_step(step: object) -> int:
    """Return ``step`` as an int; refuse a bool, a float or a negative number."""
    if isinstance(step, bool):
        raise TypeError(f"a step is an int, got the bool {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(
            f"a step is an int, got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise ValueError(f"a step must not be negative, got {value}")
    return value


def _by_step(checkpoint: Checkpoint) -> int:
    return checkpoint.step
