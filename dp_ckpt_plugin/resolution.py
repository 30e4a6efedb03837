"""Turning a restart specification into a verified checkpoint.

:func:`resolve_restart` is the one front door: the API, training and freeze
all call it. It asks ``on_resolve_restart`` on the chief rank and broadcasts
the answer (or the error) to every rank. The built-in answer, registered as
the plugin ``resolve``, follows these rules (``docs/semantics.md``, 16-21):

- ``latest``: the store's pointer, then its alias, then its newest committed
  numbered checkpoint, then the context's fallback pointers (a host's mirror,
  such as deepmd-kit's working-directory pointer) when they lead into the
  store; without a store directory, the pointer in the working directory, then
  the alias beside the prefix.
- a directory: its own pointer, then its alias, then its newest committed
  numbered checkpoint.
- a file: itself. A prefix such as ``model.ckpt``: its alias ``model.ckpt.pt``.

A pointer or alias leading outside the directory that holds it, or one that is
malformed, is reported and the next rule is tried. A candidate with a commit
record is verified; a corrupt one is moved aside into ``quarantine/`` and the
next committed checkpoint is tried, with a warning naming both. Nothing found
raises an error listing every place looked at.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pluggy

from .catalogue import committed, uncommitted
from .checkpoint import Checkpoint
from .errors import (
    CorruptCheckpointError,
    InvalidRecordError,
    RestartNotFoundError,
    UnsafePointerError,
)
from .hookspecs import hookimpl
from .layout import Family
from .pointers import is_inside, read_pointer
from .quarantine import quarantine
from .ranks import Ranks, SingleProcess
from .records import CommitRecord, read_record, verify

log = logging.getLogger(__name__)


@dataclass
class ResolveContext:
    """Where to look for a restart and how strictly to check it.

    Attributes
    ----------
    family : Family
        The family whose checkpoints count (prefix and suffix).
    store_dir : Path or None
        The store directory (``training.save_dir``), or ``None`` for a layout
        without one.
    cwd : Path
        Directory relative specifications are read from.
    prefix_path : Path or None
        The family prefix as a path (for ``latest`` without a store).
    fallback_pointers : tuple of Path
        Pointers outside the store that ``latest`` follows into the store
        when the store itself names nothing (a host's mirrors).
    digest : bool
        Whether to hash candidates with a commit record and compare the
        digest it names (the size is always checked).
    quarantine : bool
        Whether a corrupt candidate may be moved aside (chief rank only).
    """

    family: Family
    store_dir: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    prefix_path: Path | None = None
    fallback_pointers: tuple[Path, ...] = ()
    digest: bool = False
    quarantine: bool = True


@dataclass
class Resolved:
    """A checkpoint chosen for a restart, and how it was chosen.

    Attributes
    ----------
    checkpoint : Checkpoint
        The checkpoint.
    checked : str
        ``"digest"``, ``"size"`` or ``"unverified"``.
    how : str
        Which rule found it, for messages.
    warnings : list of str
        What was skipped or moved aside on the way.
    moved_aside : list of Path
        Corrupt checkpoints moved into ``quarantine/`` on the way.
    """

    checkpoint: Checkpoint
    checked: str
    how: str
    warnings: list[str] = field(default_factory=list)
    moved_aside: list[Path] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self.checkpoint.path

    @property
    def step(self) -> int | None:
        """Its step."""
        return self.checkpoint.step

    @property
    def record(self) -> CommitRecord | None:
        """Its commit record, or ``None``."""
        return self.checkpoint.record


def resolve_restart(
    pm: pluggy.PluginManager,
    spec: str,
    context: ResolveContext | None,
    ranks: Ranks | None = None,
) -> Resolved:
    """Resolve ``spec`` on the chief through ``on_resolve_restart``; broadcast it.

    ``context`` is used on rank 0 only (other ranks may pass ``None``), so only
    the chief touches the filesystem, and every rank gets the same checkpoint
    or raises the same error.
    """
    ranks = ranks or SingleProcess()
    outcome: tuple[Resolved | None, BaseException | None] = (None, None)
    if ranks.rank == 0:
        try:
            found = pm.hook.on_resolve_restart(spec=spec, context=context)
            if found is None:
                raise RestartNotFoundError(f"no plugin resolved restart {spec!r}")
            outcome = (found, None)
        except Exception as exc:
            outcome = (None, exc)
    found, error = ranks.broadcast(outcome)
    if error is not None:
        raise error
    return found


@hookimpl(trylast=True)
def on_resolve_restart(spec, context):
    """The built-in rules of this module."""
    return resolve(spec, context)


def resolve(spec: str, ctx: ResolveContext) -> Resolved:
    """Resolve ``spec`` by the rules of this module, on this process.

    Raises
    ------
    RestartNotFoundError
        Listing every place looked at.
    CorruptCheckpointError
        When an explicitly named file does not match its commit record.
    """
    search = _Search(spec, ctx)
    spec = str(spec)
    if not spec.strip():
        raise RestartNotFoundError("the restart specification is empty")
    found = _dispatch(search, spec, ctx)
    if found is None:
        raise search.fail()
    for warning in found.warnings:
        log.warning(warning)
    return found


def _dispatch(search: _Search, spec: str, ctx: ResolveContext) -> Resolved | None:
    fam = ctx.family
    if spec == "latest":
        if ctx.store_dir is not None:
            store = _absolute(ctx.store_dir, ctx.cwd)
            found = search.directory(store)
            for pointer in ctx.fallback_pointers:
                if found is not None:
                    break
                if _absolute(pointer, ctx.cwd) != store / fam.pointer:
                    # a store written without records, its pointer elsewhere
                    found = search.pointer(_absolute(pointer, ctx.cwd), [store])
            return found
        found = search.pointer(ctx.cwd / fam.pointer, [ctx.cwd])
        if found is None:
            prefix = _absolute(ctx.prefix_path or Path(fam.prefix), ctx.cwd)
            found = search.alias(prefix.parent / fam.alias, [ctx.cwd, prefix.parent])
        return found
    path = _absolute(Path(spec), ctx.cwd)
    if path.is_dir():
        extra = (
            [_absolute(ctx.store_dir, ctx.cwd)]
            if ctx.store_dir and path == ctx.cwd
            else []
        )
        return search.directory(path, extra_roots=extra)
    if path.is_file():
        search.looked.append(f"file {path}")
        return search.accept(path, f"file {path}", trusted=True, explicit=True)
    search.looked.append(f"file {path}")
    alias = path.parent / f"{path.name}{fam.suffix}"
    if alias.is_symlink() or alias.exists():
        return search.alias(alias, [path.parent], Family(path.name, fam.suffix))
    search.looked.append(f"alias {alias}")
    return None


class _Search:
    """One resolution: the places looked at and what was skipped."""

    def __init__(self, spec: str, ctx: ResolveContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.looked: list[str] = []
        self.warnings: list[str] = []
        self.bad: list[Path] = []
        self.skipped: set[Path] = set()
        self.moved: list[Path] = []

    def fail(self) -> RestartNotFoundError:
        places = "\n".join(f"  - {p}" for p in self.looked) or "  (nowhere)"
        extra = "".join(f"\n{w}" for w in self.warnings)
        return RestartNotFoundError(
            f"no checkpoint found for restart {self.spec!r}; looked at:\n{places}{extra}"
        )

    def found(self, path: Path, record: CommitRecord | None, checked: str, how: str):
        step = record.step if record else _step_from_name(path, self.ctx.family)
        family = (
            record.family
            if record
            else (
                self.ctx.family.prefix
                if self.ctx.family.step_of(path.name) is not None
                else None
            )
        )
        return Resolved(
            Checkpoint(path, step, family, record),
            checked,
            how,
            self.warnings,
            self.moved,
        )

    def accept(
        self, path: Path, how: str, *, trusted: bool, explicit: bool = False
    ) -> Resolved | None:
        """Verify a candidate; return it, or ``None`` if it cannot be used.

        ``trusted`` candidates (named explicitly or by their directory's own
        pointer) are accepted without a commit record. A record that is
        malformed or disagrees with its file means "not committed": the file
        is skipped and left in place. A file that does not match its record
        is moved aside (unless ``explicit``: then it is an error, and the
        file stays). A candidate met a second time (through the alias after
        the pointer) is skipped without a second report.
        """
        if path in self.bad or path in self.skipped:
            return None
        try:
            record = read_record(path)
        except InvalidRecordError as exc:
            if explicit:
                raise RestartNotFoundError(
                    f"{path} is not a committed checkpoint: {exc}"
                ) from None
            self.skipped.add(path)
            self.warnings.append(f"skipped {path} (not committed): {exc}")
            return None
        if record is None:
            if not trusted:
                self.warnings.append(f"skipped {path}: it has no commit record")
                return None
            self.warnings.append(
                f"{path} has no commit record, so it could not be verified "
                "(records are written for checkpoints saved to a save_dir)"
            )
            return self.found(path, None, "unverified", how)
        try:
            verify(path, record, digest=self.ctx.digest)
        except CorruptCheckpointError as exc:
            if explicit:
                raise
            self.bad.append(path)
            moved = quarantine(path) if self.ctx.quarantine else None
            if moved:
                self.moved.append(path)
            where = f"; moved aside to {moved}" if moved else ""
            self.warnings.append(f"{exc}{where}")
            return None
        checked = "digest" if self.ctx.digest else "size"
        return self.found(path, record, checked, how)

    def follow(
        self, target: Path, via: str, roots: list[Path], family: Family
    ) -> Resolved | None:
        """Follow a pointer's or alias's target, if it may be followed (rule 19)."""
        if not is_inside(target, roots):
            real = Path(os.path.realpath(target))
            if not _provably_committed(real):
                self.warnings.append(
                    f"ignored: {via} leads to {real}, outside "
                    f"{', '.join(str(r) for r in roots)}, and that file is not a "
                    "committed checkpoint; refusing to follow it"
                )
                return None
            target = real
        if not _numbered_name(target.name, family.suffix):
            self.warnings.append(
                f"ignored: {via} names {target}, which is not a numbered "
                f"<prefix>-<step>{family.suffix} checkpoint"
            )
            return None
        if not target.is_file():
            self.warnings.append(f"{via} names {target}, which does not exist")
            return None
        return self.accept(target, via, trusted=True)

    def pointer(
        self, pointer: Path, roots: list[Path], family: Family | None = None
    ) -> Resolved | None:
        self.looked.append(f"pointer {pointer}")
        try:
            target = read_pointer(pointer)
        except UnsafePointerError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        if target is None:
            return None
        return self.follow(
            target, f"pointer {pointer}", roots, family or self.ctx.family
        )

    def alias(
        self, alias: Path, roots: list[Path], family: Family | None = None
    ) -> Resolved | None:
        self.looked.append(f"alias {alias}")
        family = family or self.ctx.family
        if not alias.is_symlink():
            if not alias.is_file():
                return None
            # a hard link or copy, made where symlinks cannot be: it has no
            # record of its own, so it is never used; the newest committed
            # checkpoint (the one it copies) answers instead
            self.looked.append(f"alias {alias} is a copy, not a link: skipped")
            return None
        try:
            target = alias.resolve(strict=True)
        except (OSError, RuntimeError):
            self.warnings.append(f"alias {alias} dangles or loops")
            return None
        return self.follow(target, f"alias {alias}", roots, family)

    def newest(self, directory: Path) -> Resolved | None:
        fam = self.ctx.family
        self.looked.append(
            f"committed {fam.prefix}-<step>{fam.suffix} files in {directory}"
        )
        for candidate in committed(directory, fam, newest_first=True):
            if candidate.path in self.bad:
                continue
            found = self.accept(
                candidate.path,
                f"newest committed checkpoint in {directory}",
                trusted=False,
            )
            if found is not None:
                return found
        strays = [p.name for p in uncommitted(directory, fam)]
        if strays:
            self.warnings.append(
                f"{directory} holds numbered files without a commit record "
                f"({', '.join(sorted(strays)[:3])}); name one explicitly to use it"
            )
        return None

    def directory(
        self, directory: Path, *, extra_roots: list[Path] = ()
    ) -> Resolved | None:
        fam = self.ctx.family
        roots = [directory, *extra_roots]
        found = self.pointer(directory / fam.pointer, roots) or self.alias(
            directory / fam.alias, roots
        )
        if found is not None:
            return found
        found = self.newest(directory)
        if found is not None and (self.bad or self.skipped):
            passed = [*map(str, self.bad), *map(str, sorted(self.skipped))]
            found.warnings.append(
                f"falling back from {', '.join(passed)} to {found.path}"
            )
        return found


def _numbered_name(name: str, suffix: str) -> bool:
    """Whether ``name`` is a numbered checkpoint name of some family.

    A directory's pointer may name a checkpoint of another ``save_ckpt`` than
    the configured one (a run restarting from another run's store); what it
    may not name is the pointer itself, the lock, a record or a directory.
    """
    if name.startswith(".") or not name.endswith(suffix):
        return False
    prefix, dash, _ = name[: len(name) - len(suffix)].rpartition("-")
    return bool(prefix and dash) and Family(prefix, suffix).step_of(name) is not None


def _provably_committed(path: Path) -> bool:
    """Whether ``path`` is a committed checkpoint whose record agrees with its size."""
    try:
        record = read_record(path)
        return record is not None and path.stat().st_size == record.size
    except (InvalidRecordError, OSError):
        return False


def _absolute(path: Path, cwd: Path) -> Path:
    return path if path.is_absolute() else cwd / path


def _step_from_name(path: Path, family: Family) -> int | None:
    step = family.step_of(path.name)
    if step is None:
        # a file of another prefix: take the digits after the last '-'
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        tail = stem.rpartition("-")[2]
        step = int(tail) if tail.isdigit() else None
    return step
