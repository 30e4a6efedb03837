"""The checkpoint store: naming, commit, publication, retention, resolution.

A :class:`CheckpointStore` owns one directory ``D``. It holds one or more
families of numbered checkpoints (``D/<prefix>-<step><suffix>``), each with a
latest pointer and alias inside ``D``. Saving a checkpoint:

1. checks free space against the size of the family's previous checkpoint;
2. has the backend serialize the payload (``on_save_step``) into a temporary
   name in ``D``, fsyncs it, moves it into place and fsyncs ``D``;
3. writes the commit record last (size, sha256, step, family, backend,
   format version), atomically: the checkpoint is now committed;
4. calls ``on_commit``: the built-in publisher moves the pointer and alias,
   observers run, the built-in pruner applies retention.

Only the chief rank touches the filesystem; other ranks get the same path
back. The store never imports a serialization library: backends do.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from . import fsio
from .backends import BackendInfo, get_backend
from .errors import CheckpointWriteError, RestartNotFoundError
from .layout import Family, is_temp, record_target
from .lock import StoreLock
from .ranks import Ranks, SingleProcess
from .records import CommitRecord, make_record, read_record, record_path, write_record
from .resolve import (
    ResolveContext,
    Resolved,
    committed_checkpoints,
    read_record_or_none,
)
from .retention import KeepLast, RetentionPolicy, plan_prune

log = logging.getLogger(__name__)

#: Headroom asked for beyond the previous checkpoint's size before a write.
SPACE_HEADROOM = 1.05


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint.

    Attributes
    ----------
    path : Path
        Where it lies.
    step : int
        Its step.
    family : Family
        Its family.
    record : CommitRecord
        Its commit record.
    """

    path: Path
    step: int
    family: Family
    record: CommitRecord


@dataclass
class FamilyConfig:
    """How a store treats one family.

    Attributes
    ----------
    family : Family
        Names of the family.
    policy : RetentionPolicy
        How many committed checkpoints to keep.
    compat_pointer : Path or None
        A pointer outside the store to keep up to date too (deepmd-kit's
        ``checkpoint`` in the working directory), holding a path relative to
        its own directory.
    compat_alias : Path or None
        An alias outside the store to keep up to date too (deepmd-kit's
        ``<save_ckpt>.pt`` beside the prefix).
    """

    family: Family
    policy: RetentionPolicy = field(default_factory=lambda: KeepLast(5))
    compat_pointer: Path | None = None
    compat_alias: Path | None = None


class CheckpointStore:
    """One checkpoint directory and the families saved in it.

    Parameters
    ----------
    directory : str or Path
        The store directory ``D``; created on the first save.
    backend : str
        Name of the serialization backend (``"hdf5"``, ``"torch"``, or one a
        plugin registers).
    pm : pluggy.PluginManager
        The plugin manager whose hooks serialize, publish, prune and resolve.
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
        backend: str,
        pm: pluggy.PluginManager,
        families: Iterable[FamilyConfig] | None = None,
        ranks: Ranks | None = None,
        durable: bool = True,
        lock: bool = True,
        check_free_space: bool = True,
    ) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.pm = pm
        self.backend: BackendInfo = get_backend(pm, backend)
        configs = (
            list(families)
            if families is not None
            else [FamilyConfig(Family("model.ckpt", self.backend.suffix))]
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
        self._last_size: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process writes."""
        return self.ranks.rank == 0

    def open(self) -> None:
        """Create ``D``, take the lock and sweep leftover temporary files.

        Called by the first save; idempotent. Only the chief does anything.
        """
        if self._ready or not self.is_chief:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointWriteError(
                f"cannot create checkpoint directory {self.directory}: {exc.strerror or exc}"
            ) from exc
        if self._lock is not None:
            self._lock.acquire()
        self.sweep_leftovers()
        self._ready = True

    def close(self) -> None:
        """Release the lock."""
        if self._lock is not None:
            self._lock.release()
        self._ready = False

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sweep_leftovers(self) -> list[Path]:
        """Remove what a killed writer left; return the paths removed.

        That is our temporary files (in ``D`` and beside the compatibility
        pointer and alias) and commit records whose checkpoint is gone (a kill
        between the two unlinks of a prune). Safe only while holding the lock,
        which :meth:`open` guarantees.
        """
        removed = []
        dirs = {self.directory}
        for cfg in self.families.values():
            for extra in (cfg.compat_pointer, cfg.compat_alias):
                if extra is not None:
                    dirs.add(extra.parent)
        for directory in dirs:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                target = record_target(name) if directory == self.directory else None
                orphan = target is not None and not os.path.lexists(directory / target)
                if orphan or (
                    is_temp(name)
                    and (
                        directory == self.directory
                        or self._is_compat_temp(directory, name)
                    )
                ):
                    with contextlib.suppress(OSError):
                        os.unlink(directory / name)
                        removed.append(directory / name)
        return removed

    def _is_compat_temp(self, directory: Path, name: str) -> bool:
        for cfg in self.families.values():
            for extra in (cfg.compat_pointer, cfg.compat_alias):
                if (
                    extra is not None
                    and extra.parent == directory
                    and name.startswith(f".{extra.name}.tmp-")
                ):
                    return True
        return False

    # -- saving ------------------------------------------------------------
    def family(self, prefix: str | None = None) -> FamilyConfig:
        """Return the configuration of a family (the primary one by default)."""
        return self.families[prefix or self.primary.prefix]

    def path_for(self, step: int, prefix: str | None = None) -> Path:
        """Return where the checkpoint of ``step`` goes."""
        return self.directory / self.family(prefix).family.numbered(step)

    def save(self, step: int, state: Any, *, prefix: str | None = None) -> Path:
        """Write, commit, publish and prune one checkpoint; return its path.

        On every rank the same path is returned; only the chief writes.

        Raises
        ------
        CheckpointWriteError
            Naming the path and the cause. Temporary files are removed and
            the previous checkpoint, pointer and alias are untouched.
        """
        cfg = self.family(prefix)
        path = self.path_for(step, prefix)
        if not self.is_chief:
            return path
        self.open()
        self._check_space(cfg.family, path)
        replaces = self._write_payload(path, step, state)
        record = self._commit(path, step, cfg.family, replaces=replaces)
        self._last_size[cfg.family.prefix] = record.size
        checkpoint = Checkpoint(path, step, cfg.family, record)
        self.pm.hook.on_commit(store=self, checkpoint=checkpoint)
        return path

    def _write_payload(self, path: Path, step: int, state: Any) -> bool:
        """Write the payload atomically at ``path``; return whether it replaced one.

        Re-saving a step (deepmd-kit does after ``change_bias_after_training``)
        drops the old record just before the move; if the move then fails, the
        old record is put back. A payload that reached its name but whose
        directory fsync failed is removed, unless it replaced an older one.
        """
        previous = _file_id(path)
        old_record = read_record_or_none(path) if previous else None
        try:
            fsio.write_file_atomic(
                path,
                lambda handle: self._serialize(step, state, handle),
                durable=self.durable,
                before_replace=lambda: self._uncommit(path),
            )
        except CheckpointWriteError:
            current = _file_id(path)
            if current is not None and current != previous:
                if previous is None:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            elif old_record is not None and not record_path(path).exists():
                with contextlib.suppress(OSError):
                    write_record(path, old_record, durable=self.durable)
            raise
        return previous is not None

    def _commit(
        self, path: Path, step: int, family: Family, *, replaces: bool
    ) -> CommitRecord:
        """Write the commit record of a durable payload, last.

        On failure the record (if its directory fsync was what failed) and a
        new payload are removed; a payload that replaced an older one stays,
        since a pointer may name it.
        """
        try:
            record = make_record(
                path, step=step, family=family.prefix, backend=self.backend.name
            )
            write_record(path, record, durable=self.durable)
        except (OSError, CheckpointWriteError) as exc:
            leftovers = (record_path(path),) if replaces else (record_path(path), path)
            for leftover in leftovers:
                with contextlib.suppress(OSError):
                    fsio.remove_file(leftover)
            if isinstance(exc, CheckpointWriteError):
                raise
            raise CheckpointWriteError(
                f"could not commit {path}: {exc.strerror or exc}"
            ) from exc
        return record

    def _serialize(self, step: int, state: Any, handle) -> None:
        written = self.pm.hook.on_save_step(
            backend=self.backend.name, step=step, state=state, file=handle
        )
        if written is None:
            raise CheckpointWriteError(
                f"no plugin serialized backend {self.backend.name!r}"
            )

    def _uncommit(self, path: Path) -> None:
        """Drop the record of a checkpoint about to be overwritten (same step)."""
        rec = record_path(path)
        if rec.exists():
            fsio.remove_file(rec)

    def _check_space(self, family: Family, path: Path) -> None:
        if not self.check_free_space:
            return
        size = self._last_size.get(family.prefix)
        if size is None:
            newest = committed_checkpoints(self.directory, family, newest_first=True)
            record = read_record_or_none(newest[0][1]) if newest else None
            size = record.size if record else None
        if size is None:
            return
        free = fsio.free_bytes(self.directory)
        need = int(size * SPACE_HEADROOM)
        if free is not None and free < need:
            raise CheckpointWriteError(
                f"could not write {path}: not enough space ({free} bytes free, "
                f"the previous checkpoint took {size})"
            )

    # -- publication and retention (called from on_commit) ----------------
    def publish(self, checkpoint: Checkpoint) -> None:
        """Point the family's pointer and alias (and compatibility ones) at it."""
        cfg = self.family(checkpoint.family.prefix)
        name = checkpoint.path.name
        pointer = self.directory / cfg.family.pointer
        alias = self.directory / cfg.family.alias
        before = (_read_or_none(pointer), _link_or_none(alias))
        try:
            fsio.write_text_atomic(pointer, name + "\n", durable=self.durable)
            fsio.replace_link(alias, name, durable=self.durable)
            self._publish_compat(cfg, checkpoint)
        except CheckpointWriteError:
            self._unpublish(pointer, alias, *before)
            raise

    def _unpublish(
        self, pointer: Path, alias: Path, text: str | None, target: str | None
    ) -> None:
        """Put the pointer and alias back after a failed publication (rule 8).

        Best effort: the new checkpoint stays committed, ``latest`` goes on
        naming the previous one.
        """
        with contextlib.suppress(OSError):
            if text is None:
                fsio.remove_file(pointer)
            else:
                fsio.write_text_atomic(pointer, text, durable=self.durable)
        with contextlib.suppress(OSError):
            if target is not None:
                fsio.replace_link(alias, target, durable=self.durable)

    def _publish_compat(self, cfg: FamilyConfig, checkpoint: Checkpoint) -> None:
        if (
            cfg.compat_pointer is not None
            and cfg.compat_pointer != self.directory / cfg.family.pointer
        ):
            rel = os.path.relpath(checkpoint.path, cfg.compat_pointer.parent)
            fsio.write_text_atomic(cfg.compat_pointer, rel + "\n", durable=self.durable)
        if (
            cfg.compat_alias is not None
            and cfg.compat_alias != self.directory / cfg.family.alias
        ):
            rel = os.path.relpath(checkpoint.path, cfg.compat_alias.parent)
            fsio.replace_link(cfg.compat_alias, rel, durable=self.durable)

    def protected(self, family: Family, current: Path | None = None) -> set[str]:
        """Names retention must not remove in ``family``."""
        names = set()
        if current is not None:
            names.add(current.name)
        pointed = _read_or_none(self.directory / family.pointer)
        if pointed and pointed.strip():
            names.add(Path(pointed.strip()).name)
        linked = _link_or_none(self.directory / family.alias)
        if linked:
            names.add(Path(linked).name)
        resumed = self._resumed_from.get(family.prefix)
        if resumed is not None:
            names.add(resumed.name)
        return names

    def prune(self, checkpoint: Checkpoint) -> list[Path]:
        """Apply retention after ``checkpoint`` was committed and published."""
        fam = checkpoint.family
        cfg = self.family(fam.prefix)
        resumed = self._resumed_from.get(fam.prefix)
        if resumed is not None and checkpoint.step >= (fam.step_of(resumed.name) or 0):
            del self._resumed_from[fam.prefix]
        committed = {p.name: s for s, p in committed_checkpoints(self.directory, fam)}
        doomed = plan_prune(
            committed,
            current_step=checkpoint.step,
            protected=self.protected(fam, checkpoint.path),
            policy=cfg.policy,
        )
        removed = []
        for name in doomed:
            path = self.directory / name
            # the payload goes first: a kill or a failure in between leaves a
            # small record that names no file (readers never look at it), not
            # a full-size payload without a record that no rule would remove
            fsio.remove_file(path)
            fsio.remove_file(record_path(path))
            removed.append(path)
        if removed and self.durable:
            fsio.fsync_dir(self.directory)
        return removed

    # -- resolution ---------------------------------------------------------
    def context(
        self,
        *,
        sha256: bool = False,
        cwd: Path | None = None,
        prefix: str | None = None,
    ) -> ResolveContext:
        """Return the resolution context of this store."""
        return ResolveContext(
            family=self.family(prefix).family,
            store_dir=self.directory,
            cwd=cwd or Path.cwd(),
            sha256=sha256,
            quarantine=self.is_chief,
        )

    def resolve(
        self, spec: str, *, sha256: bool = False, cwd: Path | None = None
    ) -> Resolved:
        """Resolve a restart specification on the chief; broadcast the result.

        The checkpoint found becomes protected from retention until this run
        commits one of a later step.
        """
        ctx = self.context(sha256=sha256, cwd=cwd) if self.is_chief else None
        found = resolve_on_chief(self.pm, spec, ctx, self.ranks)
        self.protect_resumed(found.path)
        return found

    def protect_resumed(self, path: Path) -> None:
        """Keep ``path`` (the checkpoint a run resumed from) out of retention.

        The protection lasts until this store commits a checkpoint of a later
        step of the same family.
        """
        path = Path(path)
        if path.parent.resolve() != self.directory.resolve():
            return
        for prefix, cfg in self.families.items():
            if cfg.family.step_of(path.name) is not None:
                self._resumed_from[prefix] = path

    def load(self, resolved: Resolved) -> Any:
        """Read a resolved checkpoint through its backend."""
        backend = resolved.record.backend if resolved.record else self.backend.name
        state = self.pm.hook.on_load_step(backend=backend, path=resolved.path)
        if state is None:
            raise RestartNotFoundError(
                f"no plugin reads backend {backend!r} (checkpoint {resolved.path})"
            )
        return state

    def committed(self, prefix: str | None = None) -> list[Checkpoint]:
        """Return the committed checkpoints of a family, oldest first."""
        fam = self.family(prefix).family
        out = []
        for step, path in committed_checkpoints(self.directory, fam):
            record = read_record(path)
            out.append(Checkpoint(path, step, fam, record))
        return out


def _file_id(path: Path) -> tuple[int, int] | None:
    """Return the device and inode of ``path``, or ``None`` if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _link_or_none(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def resolve_with_hooks(
    pm: pluggy.PluginManager, spec: str, context: ResolveContext
) -> Resolved:
    """Ask ``on_resolve_restart`` for a checkpoint; fail if nobody answers."""
    found = pm.hook.on_resolve_restart(spec=spec, context=context)
    if found is None:
        raise RestartNotFoundError(f"no plugin resolved restart {spec!r}")
    return found


def resolve_on_chief(
    pm: pluggy.PluginManager, spec: str, context: ResolveContext | None, ranks: Ranks
) -> Resolved:
    """Resolve on rank 0 and broadcast the outcome, success or error, to all ranks.

    ``context`` is used on rank 0 only (other ranks may pass ``None``), so only
    the chief touches the filesystem, and every rank raises the same error.
    """
    outcome: tuple[Resolved | None, BaseException | None] = (None, None)
    if ranks.rank == 0:
        try:
            outcome = (resolve_with_hooks(pm, spec, context), None)
        except Exception as exc:
            outcome = (None, exc)
    found, error = ranks.broadcast(outcome)
    if error is not None:
        raise error
    return found
