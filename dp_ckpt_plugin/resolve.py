"""Turning a restart specification into a verified checkpoint path.

Rules (see ``docs/semantics.md``):

- ``latest``: the configured store's pointer, then its alias, then its newest
  committed numbered checkpoint, then (for a store plain deepmd-kit wrote)
  deepmd-kit's pointer in the working directory if it leads into the store;
  without a store directory, deepmd-kit's own pointer in the working
  directory, then the alias beside the prefix.
- a directory: its own pointer, then its alias, then its newest committed
  numbered checkpoint.
- a file: itself. A prefix such as ``model.ckpt``: its alias ``model.ckpt.pt``.

A pointer or alias leading outside the directory that holds it, or one that is
malformed, is never followed: it is reported and the next rule is tried (the
working directory's compatibility pointer may lead into the store). A
candidate with a commit record is verified; a corrupt one is moved aside into
``quarantine/`` and the next committed checkpoint is tried, with a warning
naming both. Nothing found raises an error listing every place looked at.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CorruptCheckpointError, RestartNotFoundError, UnsafePointerError
from .layout import QUARANTINE_DIR, Family, ema_prefix, record_target
from .records import CommitRecord, read_record, record_path, verify

log = logging.getLogger(__name__)

_MAX_POINTER_BYTES = 4096


@dataclass
class ResolveContext:
    """Where to look for a restart and how strictly to check it.

    Attributes
    ----------
    family : Family
        The family whose checkpoints count (prefix and suffix).
    store_dir : Path or None
        The configured ``save_dir``, or ``None`` for deepmd-kit's layout.
    cwd : Path
        Directory relative specifications are read from.
    prefix_path : Path or None
        The ``save_ckpt`` prefix as a path (for ``latest`` without a store).
    sha256 : bool
        Whether to hash candidates with a commit record (the size is always
        checked).
    quarantine : bool
        Whether a corrupt candidate may be moved aside (chief rank only).
    """

    family: Family
    store_dir: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    prefix_path: Path | None = None
    sha256: bool = False
    quarantine: bool = True


@dataclass
class Resolved:
    """A checkpoint chosen for a restart.

    Attributes
    ----------
    path : Path
        The checkpoint file (absolute).
    step : int or None
        Its step, from the commit record or the file name.
    record : CommitRecord or None
        Its commit record; ``None`` for a file plain deepmd-kit wrote.
    checked : str
        ``"sha256"``, ``"size"`` or ``"unverified"``.
    how : str
        Which rule found it, for messages.
    warnings : list of str
        What was skipped or moved aside on the way.
    """

    path: Path
    step: int | None
    record: CommitRecord | None
    checked: str
    how: str
    warnings: list[str] = field(default_factory=list)


class _Search:
    """One resolution: the places looked at and what was skipped."""

    def __init__(self, spec: str, ctx: ResolveContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.looked: list[str] = []
        self.warnings: list[str] = []
        self.bad: list[Path] = []

    # -- helpers --------------------------------------------------------
    def fail(self) -> RestartNotFoundError:
        places = "\n".join(f"  - {p}" for p in self.looked) or "  (nowhere)"
        extra = "".join(f"\n{w}" for w in self.warnings)
        return RestartNotFoundError(
            f"no checkpoint found for restart {self.spec!r}; looked at:\n{places}{extra}"
        )

    def accept(self, path: Path, how: str, *, trusted: bool) -> Resolved | None:
        """Verify a candidate; return it, or ``None`` after moving it aside.

        ``trusted`` candidates (named explicitly or by their directory's own
        pointer) are accepted without a commit record. A candidate already
        found corrupt (the pointer's target, met again through the alias) is
        skipped without a second report.
        """
        if path in self.bad:
            return None
        try:
            record = read_record(path)
            if record is None:
                if not trusted:
                    self.warnings.append(f"skipped {path}: it has no commit record")
                    return None
                note = f"{path} has no commit record (written without dp_ckpt_plugin?); it could not be verified"
                self.warnings.append(note)
                return Resolved(
                    path,
                    _step_from_name(path, self.ctx.family),
                    None,
                    "unverified",
                    how,
                    self.warnings,
                )
            verify(path, record, sha256=self.ctx.sha256)
        except CorruptCheckpointError as exc:
            self.bad.append(path)
            moved = quarantine(path) if self.ctx.quarantine else None
            where = f"; moved aside to {moved}" if moved else ""
            self.warnings.append(f"{exc}{where}")
            return None
        checked = "sha256" if self.ctx.sha256 else "size"
        return Resolved(path, record.step, record, checked, how, self.warnings)

    # -- rules ----------------------------------------------------------
    def pointer(self, pointer: Path, roots: list[Path]) -> Resolved | None:
        self.looked.append(f"pointer {pointer}")
        try:
            target = read_pointer(pointer, roots)
        except UnsafePointerError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        if target is None:
            return None
        if not target.is_file():
            self.warnings.append(
                f"pointer {pointer} names {target}, which does not exist"
            )
            return None
        return self.accept(target, f"pointer {pointer}", trusted=True)

    def alias(self, alias: Path, roots: list[Path]) -> Resolved | None:
        self.looked.append(f"alias {alias}")
        if not alias.is_symlink() and not alias.exists():
            return None
        try:
            target = alias.resolve(strict=True)
        except (OSError, RuntimeError):
            self.warnings.append(f"alias {alias} dangles or loops")
            return None
        try:
            _check_inside(target, roots, what=f"alias {alias}")
        except UnsafePointerError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        if not target.is_file():
            return None
        return self.accept(target, f"alias {alias}", trusted=True)

    def newest(self, directory: Path) -> Resolved | None:
        fam = self.ctx.family
        self.looked.append(
            f"committed {fam.prefix}-<step>{fam.suffix} files in {directory}"
        )
        for _step, path in committed_checkpoints(directory, fam, newest_first=True):
            if path in self.bad:
                continue
            found = self.accept(
                path, f"newest committed checkpoint in {directory}", trusted=False
            )
            if found is not None:
                return found
        uncommitted = [
            p.name
            for p in numbered_files(directory, fam)
            if read_record_or_none(p) is None
        ]
        if uncommitted:
            self.warnings.append(
                f"{directory} holds numbered files without a commit record "
                f"({', '.join(sorted(uncommitted)[:3])}); name one explicitly to use it"
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
        if found is not None and self.bad:
            found.warnings.append(
                f"falling back from corrupt {', '.join(map(str, self.bad))} to {found.path}"
            )
        return found


def resolve(spec: str, ctx: ResolveContext) -> Resolved:
    """Resolve ``spec`` by the rules of this module.

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
            if found is None and ctx.cwd / fam.pointer != store / fam.pointer:
                # a store plain deepmd-kit wrote (no records, its pointer in
                # the working directory): follow that pointer into the store
                found = search.pointer(ctx.cwd / fam.pointer, [store])
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
        record = read_record(path)
        if record is not None:
            verify(path, record, sha256=ctx.sha256)
        return search.accept(path, f"file {path}", trusted=True)
    alias = path.parent / f"{path.name}{fam.suffix}"
    search.looked.append(f"file {path}")
    if alias.is_symlink() or alias.exists():
        return search.alias(alias, [path.parent])
    search.looked.append(f"alias {alias}")
    return None


def read_pointer(pointer: Path, roots: list[Path]) -> Path | None:
    """Read a pointer file and return its target path, or ``None`` if absent.

    Raises
    ------
    UnsafePointerError
        When the pointer is malformed or names a path outside ``roots``.
    """
    try:
        with open(pointer, "rb") as handle:
            raw = handle.read(_MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UnsafePointerError(
            f"pointer {pointer} is a directory, not a file"
        ) from None
    if len(raw) > _MAX_POINTER_BYTES or b"\0" in raw:
        raise UnsafePointerError(
            f"pointer {pointer} is not a text file naming a checkpoint"
        )
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UnsafePointerError(
            f"pointer {pointer} is not UTF-8 text naming a checkpoint"
        ) from None
    if not text:
        raise UnsafePointerError(f"pointer {pointer} is empty")
    if "\n" in text:
        raise UnsafePointerError(f"pointer {pointer} holds more than one line")
    target = Path(text)
    if not target.is_absolute():
        # deepmd-kit writes the working-directory pointer relative to the
        # working directory, which is the pointer's own directory.
        target = pointer.parent / target
    _check_inside(target, roots, what=f"pointer {pointer}")
    return target


def _check_inside(target: Path, roots: list[Path], *, what: str) -> None:
    real = Path(os.path.realpath(target))
    for root in roots:
        if (
            real == Path(os.path.realpath(root))
            or Path(os.path.realpath(root)) in real.parents
        ):
            return
    raise UnsafePointerError(
        f"{what} leads to {real}, outside {', '.join(str(r) for r in roots)}; refusing to follow it"
    )


def numbered_files(directory: Path, family: Family) -> list[Path]:
    """Return the numbered checkpoint files of ``family`` in ``directory``."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        Path(e.path)
        for e in entries
        if family.step_of(e.name) is not None and e.is_file(follow_symlinks=False)
    ]


def read_record_or_none(path: Path) -> CommitRecord | None:
    """Return a checkpoint's commit record; malformed counts as none."""
    try:
        return read_record(path)
    except CorruptCheckpointError:
        return None


def committed_checkpoints(
    directory: Path, family: Family, *, newest_first: bool = False
) -> list[tuple[int, Path]]:
    """Return ``(step, path)`` of every committed checkpoint, ordered by step.

    A file counts when its commit record is well formed and agrees with the
    step in its name. The order comes from steps, never from timestamps.
    """
    found = []
    for path in numbered_files(directory, family):
        record = read_record_or_none(path)
        if (
            record is not None
            and record.step == family.step_of(path.name)
            and record.family == family.prefix
        ):
            found.append((record.step, path))
    return sorted(found, reverse=newest_first)


def primary_family_in(directory: Path, suffix: str, default: Family) -> Family:
    """Guess the primary family of a store from its commit records.

    Used where no training input says what ``save_ckpt`` was (``dp freeze -c
    D``). The families recorded in ``directory`` that are not the EMA family of
    another recorded one are candidates; if there is exactly one, it is the
    answer, otherwise ``default``.
    """
    families = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            target = record_target(name)
            if target is None or not target.endswith(suffix):
                continue
            record = read_record_or_none(directory / target)
            if record is not None:
                families.add(record.family)
    primaries = [f for f in families if not any(ema_prefix(g) == f for g in families)]
    if len(primaries) == 1:
        with contextlib.suppress(ValueError):
            return Family(primaries[0], suffix)
    return default


def quarantine(path: Path) -> Path | None:
    """Move a corrupt checkpoint and its record into ``quarantine/`` beside it.

    Returns the new path, or ``None`` if it could not be moved (the caller
    still skips it). Nothing is deleted.
    """
    folder = path.parent / QUARANTINE_DIR
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = folder / f"{path.name}.{stamp}"
    try:
        folder.mkdir(exist_ok=True)
        n = 0
        while dest.exists():
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
