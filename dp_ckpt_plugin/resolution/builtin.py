"""The built-in rules that turn a restart specification into a checkpoint.

Registered as the plugin ``resolve`` (``trylast``: any other resolver may
answer first); the front door (:func:`~dp_ckpt_plugin.resolution.resolve_restart`)
verifies whatever is proposed. The rules (16-21 of ``docs/guarantees.md``):

- ``latest``: the store's pointer, then its alias, then its newest committed
  numbered checkpoint, then the context's fallback pointers (a host's mirror,
  such as deepmd-kit's working-directory pointer) when they lead into the
  store; without a store directory, the pointer in the working directory,
  then the alias beside the prefix.
- a directory: its own pointer, then its alias, then its newest committed
  numbered checkpoint.
- a file: itself; a link: the checkpoint it names; a pointer: what it names,
  else its directory's latest. A prefix such as ``model.ckpt``: its alias
  ``model.ckpt.pt``, else the newest committed checkpoint of that prefix.

A pointer or alias leading outside the directory that holds it, or one that
is malformed, is reported and the next rule is tried. A candidate with a
commit record is verified; a corrupt one of the store is moved aside into
``quarantine/`` and the next committed checkpoint is tried, with a warning
naming both. Nothing found raises an error listing every place looked at.
"""

from __future__ import annotations

import difflib
import itertools
import re
from pathlib import Path

from ..checkpoint.catalogue import committed, uncommitted
from ..checkpoint.layout import ARCHIVE_DIR, Family, parse_numbered
from ..checkpoint.pointers import is_inside, read_pointer
from ..checkpoint.records import read_record
from ..errors import (
    CorruptCheckpointError,
    InvalidRecordError,
    RestartNotFoundError,
    UnreadableFileError,
    UnsafePointerError,
)
from ..markers import hookimpl
from ..storage import Storage, entries_of, entry_or_none
from . import ResolveContext, Resolved, checkpoint_at, follow_link
from .quarantine import set_aside


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
    if spec == "latest":
        if ctx.store_dir is not None:
            store = ctx.cwd / ctx.store_dir
            found = search.directory(store)
            for pointer in ctx.fallback_pointers:  # until one leads into the store
                if found is None and ctx.cwd / pointer != store / fam.pointer:
                    # a store written without records, its pointer elsewhere
                    found = search.pointer(ctx.cwd / pointer, [store])
            if found is None:
                search.note_archives(store)
            return found
        found = search.pointer(ctx.cwd / fam.pointer, [ctx.cwd])
        if found is None:
            prefix = ctx.cwd / (ctx.prefix_path or Path(fam.prefix))
            found = search.alias(prefix.parent / fam.alias, [ctx.cwd, prefix.parent])
        return found
    path = ctx.cwd / spec
    entry = entry_or_none(path, follow=True, storage=search.storage)
    if entry is not None and entry.is_dir:
        extra = [ctx.cwd / ctx.store_dir] if ctx.store_dir and path == ctx.cwd else []
        return search.directory(path, extra_roots=extra)
    if entry is not None and entry.is_file and _is_pointer(path, ctx):
        # a pointer named itself: what it names, else its directory's latest
        return search.pointer(path, [path.parent]) or search.directory(path.parent)
    if entry is not None and entry.is_file:
        search.looked.append(f"file {path}")
        target, link = follow_link(path, search.storage)
        how = f"file {path}" if link is None else f"link {path}"
        found = search.accept(target, how, trusted=True, explicit=True)
        if found is not None and link is not None:
            found.rule, found.via = "link", link
        return found
    search.looked.append(f"file {path}")
    alias = path.parent / f"{path.name}{fam.suffix}"
    if entry_or_none(alias, storage=search.storage) is None:
        search.looked.append(f"alias {alias}")
        return None
    # a prefix: its alias, else the newest committed checkpoint of that family
    prefix = Family(path.name, fam.suffix)
    found = search.alias(alias, [path.parent], prefix)
    return found or search.newest(path.parent, prefix)


def _is_pointer(path: Path, ctx: ResolveContext) -> bool:
    """Whether a named file is a pointer: no checkpoint name, no record, one line."""
    if _numbered_name(path.name, ctx.family.suffix) or path.name.startswith("."):
        return False
    try:
        if read_record(path, storage=ctx.storage) is not None:
            return False
        return read_pointer(path, storage=ctx.storage) is not None
    except (InvalidRecordError, UnsafePointerError, UnreadableFileError):
        return False


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

    def note_archives(self, store: Path) -> None:
        """Say where the newest archived run is, when ``latest`` found nothing."""
        root = store / ARCHIVE_DIR
        listed = entries_of(root, self.storage)
        folders = sorted(name for name, kind in listed if kind == "dir")
        if folders:
            newest = root / folders[-1]
            self.warnings.append(
                f"{store} holds no committed checkpoint of its own, but earlier "
                f"runs are archived in {root} (newest: {newest}); name a "
                "checkpoint there to restart from it"
            )

    def fail(self) -> RestartNotFoundError:
        places = "\n".join(f"  - {p}" for p in self.looked) or "  (nowhere)"
        extra = "".join(f"\n{w}" for w in self.warnings)
        close = self.suggestion()
        hint = f" (did you mean {close}?)" if close else ""
        return RestartNotFoundError(
            f"no checkpoint found for restart {self.spec!r}{hint}; "
            f"looked at:\n{places}{extra}"
        )

    def suggestion(self) -> str | None:
        """A handle close to a mistyped one: ``latest``, ``best`` or a name beside it.

        Only for a specification that names nothing on disk (a typo), never
        for one that exists and holds no checkpoint.
        """
        spec = str(self.spec).rstrip("/")
        head, slash, tail = spec.rpartition("/")
        parent = self.ctx.cwd / (head + slash or ".")
        if not tail or entry_or_none(parent / tail, storage=self.storage) is not None:
            return None
        words = [] if slash else ["latest", "best"]
        listed = itertools.islice(entries_of(parent, self.storage), 2000)
        names = [name for name, _ in listed if not name.startswith(".")]
        suffix = self.ctx.family.suffix  # and the prefix of each alias:
        names += [n.removesuffix(suffix) for n in names if n.endswith(suffix)]
        found = difflib.get_close_matches(tail, words + names, n=1, cutoff=0.75)
        if not found or _digits_apart(tail, found[0]):
            return None  # another step of a checkpoint is not a typo
        return f"{head}{slash}{found[0]}"

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
            record = self.ctx.verifier.record(path)
        except InvalidRecordError as exc:
            if explicit:
                raise RestartNotFoundError(
                    f"{path} is not a committed checkpoint: {exc}"
                ) from None
            self.skipped.add(path)
            self.warnings.append(f"skipped {path} (not committed): {exc}")
            return None
        if record is None and not trusted:
            self.warnings.append(f"skipped {path}: it has no commit record")
            return None
        try:  # without a record, the front door checks its own checksums (admit)
            if record is not None:
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
            moved, warning = set_aside(path, exc, self.ctx)
            if moved:
                self.moved.append(path)
            self.warnings.append(warning)
            return None
        return Resolved(
            checkpoint_at(path, record, self.ctx.family),
            self.ctx.level if record is not None else "unverified",
            how,
            self.warnings,
            self.moved,
            rule,
            via,
            fell_back=bool(self.bad or self.skipped),
        )

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
        entry = entry_or_none(target, follow=True, storage=self.storage)
        if entry is None or not entry.is_file:
            self.warnings.append(f"{label} names {target}, which does not exist")
            return None
        return self.accept(target, label, trusted=True, rule=kind, via=via)

    def pointer(self, pointer: Path, roots: list[Path]) -> Resolved | None:
        self.looked.append(f"pointer {pointer}")
        try:
            target = read_pointer(pointer, storage=self.storage)
        except UnsafePointerError as exc:
            self.warnings.append(f"ignored: {exc}")
            return None
        if target is None:
            return None
        return self.follow(target, pointer, "pointer", roots, self.ctx.family)

    def alias(
        self, alias: Path, roots: list[Path], family: Family | None = None
    ) -> Resolved | None:
        self.looked.append(f"alias {alias}")
        family = family or self.ctx.family
        entry = entry_or_none(alias, storage=self.storage)
        if entry is None:
            return None
        if entry.kind != "link":
            # a hard link or copy, made where symlinks cannot be: it has no
            # record of its own, so it is never used; the newest committed
            # checkpoint (the one it copies) answers instead
            if entry.is_file:
                self.looked.append(f"alias {alias} is a copy, not a link: skipped")
            return None
        if entry_or_none(alias, follow=True, storage=self.storage) is None:
            self.warnings.append(f"alias {alias} dangles or loops")
            return None
        return self.follow(self.storage.real(alias), alias, "alias", roots, family)

    def newest(self, directory: Path, family: Family | None = None) -> Resolved | None:
        fam = family or self.ctx.family
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
        how = f"newest committed checkpoint in {directory}"
        for candidate in candidates:  # accept passes over one found corrupt already
            found = self.accept(
                candidate.path, how, trusted=False, rule="newest", via=directory
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
    return not name.startswith(".") and parse_numbered(name, suffix) is not None


def _provably_committed(path: Path, storage: Storage) -> bool:
    """Whether ``path`` is a committed checkpoint whose record agrees with its size."""
    try:
        record = read_record(path, storage=storage)
        found = storage.entry(path, follow=True)
    except (InvalidRecordError, UnreadableFileError):
        return False
    return bool(record and found and found.is_file and record.accepts(found.size))


_STEP_NAME = re.compile(r"(.*-)([0-9]+)((?:\.[^.]*)?)")


def _digits_apart(a: str, b: str) -> bool:
    """Whether two names are two steps of one family (``x-99.pt``, ``x-9.pt``)."""
    found_a, found_b = _STEP_NAME.fullmatch(a), _STEP_NAME.fullmatch(b)
    return bool(
        found_a
        and found_b
        and (found_a[1], found_a[3]) == (found_b[1], found_b[3])
        and found_a[2] != found_b[2]
    )
