"""Turning a restart specification into a verified checkpoint.

:func:`resolve_restart` is the one front door: the API, training, freeze and
the ``dp-ckpt`` command all call it. It asks ``on_resolve_restart`` on the
chief rank, *verifies what the answering plugin proposes* (:func:`admit`),
and broadcasts the answer (or the error) to every rank. The built-in answer,
registered as the plugin ``resolve``, follows these rules (rules 16-21 of
``docs/guarantees.md``):

- ``latest``: the store's pointer, then its alias, then its newest committed
  numbered checkpoint, then the context's fallback pointers (a host's mirror,
  such as deepmd-kit's working-directory pointer) when they lead into the
  store; without a store directory, the pointer in the working directory, then
  the alias beside the prefix.
- a directory: its own pointer, then its alias, then its newest committed
  numbered checkpoint.
- a file: itself; a link: the checkpoint it names. A prefix such as
  ``model.ckpt``: its alias ``model.ckpt.pt``.

A pointer or alias leading outside the directory that holds it, or one that is
malformed, is reported and the next rule is tried. A candidate with a commit
record is verified; a corrupt one of the store is moved aside into
``quarantine/`` and the next committed checkpoint is tried, with a warning
naming both. Nothing found raises an error listing every place looked at.

Warnings are returned (:attr:`Resolved.warnings`), never logged here: the
caller says them once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .catalogue import committed, uncommitted
from .checkpoint import Checkpoint
from .errors import (
    CorruptCheckpointError,
    InvalidRecordError,
    RestartNotFoundError,
    UnreadableFileError,
    UnsafePointerError,
)
from .hookspecs import hookimpl
from .layout import Family
from .pointers import is_inside, read_pointer
from .quarantine import quarantine
from .ranks import Ranks, SingleProcess
from .records import CommitRecord, read_record, verify
from .storage import Storage, default_storage

if TYPE_CHECKING:
    import pluggy

    from .hooks import Hooks


class Verifier:
    """Checks checkpoints against their records, each file once per resolution.

    A file is identified by its real path, device, inode, size and time, so
    a file replaced meanwhile is checked again; the front door asks again
    for what a rule checked already, at no cost.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._done: dict[tuple, bool] = {}

    def verify(self, path: Path, record: CommitRecord, *, digest: bool) -> None:
        """:func:`~dp_ckpt_plugin.records.verify`, remembered.

        Raises
        ------
        CorruptCheckpointError
            When it does not match its record.
        FileNotFoundError
            When it is gone.
        """
        found = self.storage.entry(path, follow=True)
        key = (
            self.storage.real(path),
            found and (found.dev, found.ino, found.size, found.mtime_ns),
            record.size,
            record.digest,
            record.replaces,
        )
        if self._done.get(key) is True or (self._done.get(key) is False and not digest):
            return
        verify(path, record, digest=digest, storage=self.storage)
        self._done[key] = digest or self._done.get(key, False)


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
        Whether a corrupt candidate of the store may be moved aside (chief
        rank only, a writer holding the store's lock).
    storage : Storage or None
        How files are read (the local file system by default).
    verifier : Verifier or None
        Shared by the rules and the front door so that a file is hashed
        once; made on first use.
    """

    family: Family
    store_dir: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    prefix_path: Path | None = None
    fallback_pointers: tuple[Path, ...] = ()
    digest: bool = False
    quarantine: bool = True
    storage: Storage | None = None
    verifier: Verifier | None = None

    def __post_init__(self) -> None:
        if self.storage is None:
            self.storage = default_storage()
        if self.verifier is None:
            self.verifier = Verifier(self.storage)

    @property
    def level(self) -> str:
        """``"digest"`` or ``"size"``: what a verified candidate was checked for."""
        return "digest" if self.digest else "size"


@dataclass
class Resolved:
    """A checkpoint chosen for a restart, and how it was chosen.

    Attributes
    ----------
    checkpoint : Checkpoint
        The checkpoint (a link is resolved to the file it names).
    checked : str
        ``"digest"``, ``"size"`` or ``"unverified"``.
    how : str
        Which rule found it, for people.
    warnings : list of str
        What was skipped or moved aside on the way, for the caller to say.
    moved_aside : list of Path
        Corrupt checkpoints moved into ``quarantine/`` on the way.
    rule : str
        The rule that found it: ``pointer``, ``alias``, ``newest``, ``file``,
        ``link``, ``best``, or ``plugin`` (any other resolver).
    via : Path or None
        The pointer, alias, link or directory the rule read.
    fell_back : bool
        Whether newer candidates were unusable (corrupt, not committed).
    """

    checkpoint: Checkpoint
    checked: str
    how: str
    warnings: list[str] = field(default_factory=list)
    moved_aside: list[Path] = field(default_factory=list)
    rule: str = "plugin"
    via: Path | None = None
    fell_back: bool = False

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
    hooks: Hooks | pluggy.PluginManager,
    spec: str,
    context: ResolveContext | None,
    ranks: Ranks | None = None,
) -> Resolved:
    """Resolve ``spec`` on the chief through ``on_resolve_restart``; verify; broadcast.

    ``context`` is used on rank 0 only (other ranks may pass ``None``), so only
    the chief touches the filesystem, and every rank gets the same checkpoint
    or raises the same error.
    """
    from .hooks import Hooks

    ranks = ranks or SingleProcess()
    outcome: tuple[Resolved | None, BaseException | None] = (None, None)
    if ranks.rank == 0:
        try:
            found = Hooks.of(hooks).propose_restart(spec, context)
            if found is None:
                raise RestartNotFoundError(f"no plugin resolved restart {spec!r}")
            outcome = (admit(found, context), None)
        except Exception as exc:
            outcome = (None, exc)
    found, error = ranks.broadcast(outcome)
    if error is not None:
        raise error
    return found


def admit(found: Resolved, ctx: ResolveContext) -> Resolved:
    """The front door's check of whatever a rule or plugin proposes.

    The file is followed through links to the checkpoint they name and
    checked as that checkpoint: its commit record is read and it is verified
    at the context's level (the size always, the digest when asked). A file
    without a record is accepted unverified, with a warning.

    Raises
    ------
    RestartNotFoundError
        When the proposal names nothing, or a file whose record is malformed.
    CorruptCheckpointError
        When it does not match its record.
    """
    if not isinstance(found, Resolved):
        raise RestartNotFoundError(
            f"a resolver plugin answered {type(found).__name__}, not a Resolved"
        )
    storage = ctx.storage
    named = Path(os.path.abspath(ctx.cwd / found.path))
    path, via = _follow_link(named, storage)
    entry = storage.entry(path, follow=True)
    if entry is None or not entry.is_file:
        what = "does not exist" if entry is None else f"is not a file ({entry.kind})"
        raise RestartNotFoundError(f"restart checkpoint {named} {what}")
    try:
        record = read_record(path, storage=storage)
    except InvalidRecordError as exc:
        raise RestartNotFoundError(
            f"{path} is not a committed checkpoint: {exc}"
        ) from None
    warnings = list(found.warnings)
    if record is None:
        checked = "unverified"
        note = _unrecorded(path)
        if note not in warnings:
            warnings.append(note)
        step, family = found.step, found.checkpoint.family
        if path.name != found.path.name:  # a link named something else
            step = _step_from_name(path, ctx.family)
            family = (
                ctx.family.prefix if ctx.family.step_of(path.name) is not None else None
            )
    else:
        try:
            ctx.verifier.verify(path, record, digest=ctx.digest)
        except FileNotFoundError:
            raise RestartNotFoundError(f"restart checkpoint {path} went away") from None
        checked = ctx.level
        step, family = record.step, record.family
    return Resolved(
        Checkpoint(path, step, family, record),
        checked,
        found.how,
        warnings,
        list(found.moved_aside),
        found.rule,
        found.via or via,
        found.fell_back,
    )


def _follow_link(path: Path, storage: Storage) -> tuple[Path, Path | None]:
    """The file a (chain of) link(s) names, and the link; a file is itself.

    The file keeps the directory spelling of the link when both lie in the
    same directory (a store's alias), so messages show the store's path.
    """
    entry = storage.entry(path)
    if entry is None or entry.kind != "link":
        return path, None
    real = storage.real(path)
    if storage.real(path.parent) == real.parent:
        return path.parent / real.name, path
    return real, path


def _unrecorded(path: Path) -> str:
    return (
        f"{path} has no commit record, so it could not be verified "
        "(records are written for checkpoints saved to a save_dir)"
    )


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
    if "\0" in spec:
        raise RestartNotFoundError("the restart specification holds a NUL character")
    found = _dispatch(search, spec, ctx)
    if found is None:
        raise search.fail()
    return found


def _dispatch(search: _Search, spec: str, ctx: ResolveContext) -> Resolved | None:
    fam = ctx.family
    storage = ctx.storage
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
    entry = _entry(storage, path, follow=True)
    if entry is not None and entry.is_dir:
        extra = (
            [_absolute(ctx.store_dir, ctx.cwd)]
            if ctx.store_dir and path == ctx.cwd
            else []
        )
        return search.directory(path, extra_roots=extra)
    if entry is not None and entry.is_file:
        search.looked.append(f"file {path}")
        target, link = _follow_link(path, storage)
        how = f"file {path}" if link is None else f"link {path}"
        found = search.accept(target, how, trusted=True, explicit=True)
        if found is not None and link is not None:
            found.rule, found.via = "link", link
        return found
    search.looked.append(f"file {path}")
    alias = path.parent / f"{path.name}{fam.suffix}"
    if _entry(storage, alias) is not None:
        return search.alias(alias, [path.parent], Family(path.name, fam.suffix))
    search.looked.append(f"alias {alias}")
    return None


def _entry(storage: Storage, path: Path, *, follow: bool = False):
    try:
        return storage.entry(path, follow=follow)
    except UnreadableFileError:
        return None


class _Search:
    """One resolution: the places looked at and what was skipped."""

    def __init__(self, spec: str, ctx: ResolveContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.storage = ctx.storage
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

    def found(
        self, path: Path, record: CommitRecord | None, checked: str, how: str, rule: str
    ) -> Resolved:
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
            rule,
            fell_back=bool(self.bad or self.skipped),
        )

    def accept(
        self,
        path: Path,
        how: str,
        *,
        trusted: bool,
        explicit: bool = False,
        rule: str = "file",
        via: Path | None = None,
    ) -> Resolved | None:
        """Verify a candidate; return it, or ``None`` if it cannot be used.

        ``trusted`` candidates (named explicitly or by their directory's own
        pointer) are accepted without a commit record. A record that is
        malformed or disagrees with its file means "not committed": the file
        is skipped and left in place. A file that does not match its record
        is moved aside when it belongs to the store being resolved (unless
        ``explicit``: then it is an error, and the file stays). A candidate
        met a second time (through the alias after the pointer) is skipped
        without a second report; one that went away meanwhile is skipped.
        """
        if path in self.bad or path in self.skipped:
            return None
        try:
            record = read_record(path, storage=self.storage)
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
            self.warnings.append(_unrecorded(path))
            found = self.found(path, None, "unverified", how, rule)
            found.via = via
            return found
        try:
            self.ctx.verifier.verify(path, record, digest=self.ctx.digest)
        except FileNotFoundError:
            if explicit:
                raise RestartNotFoundError(f"{path} went away") from None
            self.skipped.add(path)
            self.warnings.append(f"skipped {path}: it went away meanwhile")
            return None
        except CorruptCheckpointError as exc:
            if explicit:
                raise
            self.bad.append(path)
            moved = None
            if self.ctx.quarantine and self.ctx.store_dir is not None:
                store = _absolute(self.ctx.store_dir, self.ctx.cwd)
                moved = quarantine(path, store, storage=self.storage)
            if moved:
                self.moved.append(path)
            where = f"; moved aside to {moved}" if moved else ""
            self.warnings.append(f"{exc}{where}")
            return None
        found = self.found(path, record, self.ctx.level, how, rule)
        found.via = via
        return found

    def follow(
        self, target: Path, via: Path, kind: str, roots: list[Path], family: Family
    ) -> Resolved | None:
        """Follow a pointer's or alias's target, if it may be followed (rule 19)."""
        label = f"{kind} {via}"
        if not is_inside(target, roots, storage=self.storage):
            real = self.storage.real(target)
            if not _provably_committed(real, self.storage):
                self.warnings.append(
                    f"ignored: {label} leads to {real}, outside "
                    f"{', '.join(str(r) for r in roots)}, and that file is not a "
                    "committed checkpoint; refusing to follow it"
                )
                return None
            target = real
        if not _numbered_name(target.name, family.suffix):
            self.warnings.append(
                f"ignored: {label} names {target}, which is not a numbered "
                f"<prefix>-<step>{family.suffix} checkpoint"
            )
            return None
        entry = _entry(self.storage, target, follow=True)
        if entry is None or not entry.is_file:
            self.warnings.append(f"{label} names {target}, which does not exist")
            return None
        return self.accept(target, label, trusted=True, rule=kind, via=via)

    def pointer(
        self, pointer: Path, roots: list[Path], family: Family | None = None
    ) -> Resolved | None:
        self.looked.append(f"pointer {pointer}")
        try:
            target = read_pointer(pointer, storage=self.storage)
        except UnsafePointerError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        if target is None:
            return None
        return self.follow(target, pointer, "pointer", roots, family or self.ctx.family)

    def alias(
        self, alias: Path, roots: list[Path], family: Family | None = None
    ) -> Resolved | None:
        self.looked.append(f"alias {alias}")
        family = family or self.ctx.family
        entry = _entry(self.storage, alias)
        if entry is None:
            return None
        if entry.kind != "link":
            # a hard link or copy, made where symlinks cannot be: it has no
            # record of its own, so it is never used; the newest committed
            # checkpoint (the one it copies) answers instead
            if entry.is_file:
                self.looked.append(f"alias {alias} is a copy, not a link: skipped")
            return None
        if _entry(self.storage, alias, follow=True) is None:
            self.warnings.append(f"alias {alias} dangles or loops")
            return None
        return self.follow(self.storage.real(alias), alias, "alias", roots, family)

    def newest(self, directory: Path) -> Resolved | None:
        fam = self.ctx.family
        self.looked.append(
            f"committed {fam.prefix}-<step>{fam.suffix} files in {directory}"
        )
        try:
            candidates = committed(
                directory, fam, newest_first=True, storage=self.storage
            )
        except UnreadableFileError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        for candidate in candidates:
            if candidate.path in self.bad:
                continue
            found = self.accept(
                candidate.path,
                f"newest committed checkpoint in {directory}",
                trusted=False,
                rule="newest",
                via=directory,
            )
            if found is not None:
                return found
        try:
            strays = [p.name for p in uncommitted(directory, fam, storage=self.storage)]
        except UnreadableFileError:
            strays = []
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


def _provably_committed(path: Path, storage: Storage) -> bool:
    """Whether ``path`` is a committed checkpoint whose record agrees with its size."""
    try:
        record = read_record(path, storage=storage)
        found = storage.entry(path, follow=True)
    except (InvalidRecordError, UnreadableFileError):
        return False
    return (
        record is not None
        and found is not None
        and found.is_file
        and record.accepts(found.size)
    )


def _absolute(path: Path, cwd: Path) -> Path:
    return path if path.is_absolute() else cwd / path


def _step_from_name(path: Path, family: Family) -> int | None:
    step = family.step_of(path.name)
    if step is None:
        # a file of another prefix: take the digits after the last '-'
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        tail = stem.rpartition("-")[2]
        step = int(tail) if tail.isdigit() and len(tail) < 19 else None
    return step
