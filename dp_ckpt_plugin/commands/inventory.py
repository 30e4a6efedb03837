"""What a store directory holds, read without a training input and without writing.

:func:`read_inventory` finds the families of ``D`` (from its manifest, else from
its commit records and pointers), each family's committed checkpoints, its
pointer and alias targets, the numbered files that are not committed, and what
lies in ``D/quarantine/`` and ``D/archive/``. Nothing is moved, hashed or
locked: the commands that change a store (``prune``) or read every byte
(``verify``) build on it. Each checkpoint's size on disk is compared with its
record (one ``lstat``), so a file cut short shows as such without reading it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.layout import (
    ARCHIVE_DIR,
    POINTER_NAME,
    QUARANTINE_DIR,
    Family,
    parse_numbered,
    record_target,
)
from ..checkpoint.manifest import Manifest, read_manifest
from ..checkpoint.pointers import named_by, read_pointer
from ..checkpoint.records import read_record
from ..errors import InvalidRecordError, UnreadableFileError, UnsafePointerError
from ..storage import Storage, default_storage, entry_or_none
from ..store.archive import archive_folders
from .views import Aside, Listed, Listing, Shelf


def read_inventory(directory: Path, *, storage: Storage | None = None) -> Listing:
    """Read what ``directory`` holds (see the module docs); it must exist.

    The listing also names the numbered files that were gone when their
    record was read (``vanished``: a live store's retention removed them
    meanwhile), neither checkpoints nor strays.
    """
    directory = Path(os.path.abspath(directory))
    storage = storage or default_storage()
    warnings: list[str] = []
    try:
        manifest = read_manifest(directory, storage=storage)
    except InvalidRecordError as exc:
        manifest = None
        warnings.append(f"{exc}; families are read from the commit records")
    found = _Reader(directory, storage)
    if manifest is not None:
        for info in manifest.families:
            found.shelve(info.family, info.retention(), info.reason)
    found.find_families()
    for shelf in found.shelves.values():
        found.fill(shelf)
    try:
        archives = archive_folders(directory, storage=storage)
    except UnreadableFileError as exc:
        archives = []
        warnings.append(f"{directory / ARCHIVE_DIR}: {exc}")
    families = found.ordered(manifest)
    quarantine = directory / QUARANTINE_DIR
    if manifest is not None:
        formats = {manifest.format}
    else:
        formats = {c.format for f in families for c in f.items}
    return Listing(
        where=str(directory),
        families=families,
        format=formats.pop() if len(formats) == 1 else None,
        manifest=manifest is not None,
        strays=sorted(
            found.strays.values(), key=lambda s: (s.family or "", s.step or 0)
        ),
        quarantined=[  # its regular files that are not commit records
            Aside(name, str(quarantine / name), size=_size(quarantine / name, storage))
            for name, kind in _listdir(quarantine, storage).items()
            if kind == "file" and not name.endswith(".commit.json")
        ],
        archives=[
            Aside(
                a.name,
                str(a.path),
                size=a.size,
                created=a.created,
                checkpoints=tuple(a.checkpoints),
            )
            for a in archives
        ],
        warnings=warnings,
        vanished=found.vanished,
    )


def listed(c: Checkpoint, on_disk: int | None = None) -> Listed:
    """A checkpoint of a directory as listed (its record read)."""
    record = c.record
    return Listed(
        name=c.name,
        step=c.step,
        family=c.family or (record.family if record else None),
        size=record.size if record else on_disk or 0,
        where=str(c.path),
        digest=record.digest if record else None,
        metrics=record.metrics if record else None,
        created=(record.created or None) if record else None,
        format=record.format if record else None,
        record=record,
        on_disk=on_disk,
        torn=bool(record and on_disk is not None and not record.accepts(on_disk)),
    )


def _stray(path: Path, family: str | None, step: int | None, problem: str) -> Aside:
    return Aside(path.name, str(path), family, step, problem)


def _size(path: Path, storage: Storage, *, follow: bool = True) -> int | None:
    found = entry_or_none(path, follow=follow, storage=storage)
    return found.size if found is not None else None


def _gone(path: Path, storage: Storage) -> bool:
    """Whether a listed file is no longer there (removed since the listing)."""
    try:
        return storage.entry(path) is None
    except UnreadableFileError:
        return False


def _listdir(directory: Path, storage: Storage) -> dict[str, str]:
    """Name to kind of the entries of ``directory``, sorted; a link is not followed.

    A ``quarantine`` or ``archive`` that is a link to elsewhere lists nothing.
    """
    if directory.name in (ARCHIVE_DIR, QUARANTINE_DIR):
        found = storage.entry(directory)
        if found is not None and not found.is_dir:
            return {}
    with contextlib.suppress(UnreadableFileError):
        return dict(sorted(storage.names(directory)))
    return {}


class _Reader:
    """What :func:`read_inventory` gathers of one directory as it reads: its
    entries (name to kind), its families, its strays and the files gone."""

    def __init__(self, directory: Path, storage: Storage) -> None:
        self.directory = directory
        self.storage = storage
        self.names = _listdir(directory, storage)
        self.shelves: dict[str, Shelf] = {}
        self.strays: dict[Path, Aside] = {}
        self.vanished: list[Path] = []

    def shelve(self, family: Family, policy=None, reason: str | None = None) -> None:
        """Add ``family`` (with the policy its manifest records, if any)."""
        self.shelves[family.prefix] = Shelf(
            family.prefix,
            suffix=family.suffix,
            pointer=family.pointer,
            policy=policy,
            reason=reason,
        )

    def find_families(self) -> None:
        """Add the families the records and pointers name; note bad records."""
        directory, storage = self.directory, self.storage
        for name in self.names:
            target = record_target(name)
            if target is None:
                continue
            path = directory / target
            match = parse_numbered(target)
            try:
                record = read_record(path, storage=storage)
            except InvalidRecordError as exc:
                if self.names.get(target) == "file":
                    prefix, step = (match.prefix, match.step) if match else (None, None)
                    why = f"malformed commit record: {exc}"
                    self.strays[path] = _stray(path, prefix, step, why)
                continue
            if record is None or not target.startswith(f"{record.family}-"):
                continue
            suffix = target[len(f"{record.family}-{record.step}") :]
            if record.family not in self.shelves and suffix.startswith("."):
                with contextlib.suppress(ValueError):
                    self.shelve(Family(record.family, suffix))
        for name in self.names:  # pointers: plain deepmd-kit writes no records
            if name != POINTER_NAME and not name.startswith(f"{POINTER_NAME}."):
                continue
            with contextlib.suppress(UnsafePointerError, ValueError):
                named = read_pointer(directory / name, storage=storage)
                match = parse_numbered(named.name) if named else None
                if match and match.prefix not in self.shelves:
                    self.shelve(Family(match.prefix, match.suffix, name))

    def fill(self, shelf: Shelf) -> None:
        """Read a family's committed checkpoints, pointer, alias and strays."""
        directory, storage, fam = self.directory, self.storage, shelf.family()
        numbered = [
            directory / n
            for n, kind in self.names.items()
            if kind == "file" and fam.step_of(n) is not None
        ]
        for path in numbered:
            try:
                record = read_record(path, storage=storage)
            except InvalidRecordError:
                continue  # reported among the strays already
            step = fam.step_of(path.name)
            if record is None and _gone(path, storage):
                self.vanished.append(path)
            elif record is None:
                self.strays[path] = _stray(path, fam.prefix, step, "no commit record")
            elif record.step != step or record.family != fam.prefix:
                why = "its commit record describes another file"
                self.strays[path] = _stray(path, fam.prefix, step, why)
            else:
                on_disk = _size(path, storage, follow=False)
                checkpoint = Checkpoint(path, step, fam.prefix, record)
                shelf.items.append(listed(checkpoint, on_disk))
        shelf.items.sort(key=lambda c: c.step)
        own = named_by(directory, fam, storage=storage)  # its pointer and alias
        pointers = [fam.pointer]
        if fam.pointer == POINTER_NAME:  # found without a manifest: any pointer
            pointers += [n for n in self.names if n.startswith(f"{POINTER_NAME}.")]
        for name in pointers:
            family = Family(fam.prefix, fam.suffix, name)
            named = (
                own["pointer"]
                if name == fam.pointer
                else named_by(directory, family, storage=storage)["pointer"]
            )
            if named is not None and fam.step_of(named) is not None:
                shelf.latest = named
                break
        linked = own["alias"]
        if linked and fam.step_of(linked) is not None:
            shelf.alias = linked

    def ordered(self, manifest: Manifest | None) -> list[Shelf]:
        """The manifest's order; without one, the family ``D/checkpoint`` names
        first."""
        if manifest is not None:
            return list(self.shelves.values())
        named = None
        with contextlib.suppress(UnsafePointerError):
            found = read_pointer(self.directory / POINTER_NAME, storage=self.storage)
            named = found.name if found is not None else None
        primary = None
        for prefix, shelf in self.shelves.items():
            if named and shelf.family().step_of(named) is not None:
                primary = prefix
                break
        shelves = self.shelves.values()
        return sorted(shelves, key=lambda f: (f.prefix != primary, f.prefix))
