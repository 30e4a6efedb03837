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
from dataclasses import dataclass, field
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
from ..retention import RetentionPolicy
from ..storage import Storage, default_storage
from ..store.archive import ArchiveFolder, archive_folders

#: A numbered file name: ``<prefix>-<step><suffix>``, the step in plain decimal.


@dataclass
class FamilyView:
    """One family of a store, as found on disk.

    Attributes
    ----------
    family : Family
        Its names.
    policy : RetentionPolicy or None
        The retention policy the manifest records; ``None`` when unknown.
    reason : str or None
        That policy's reason, for people (also for a policy the manifest
        could only describe, not record).
    checkpoints : list of Checkpoint
        Its committed checkpoints, oldest first.
    pointer : str or None
        The file name its pointer names.
    alias : str or None
        The file name its alias leads to.
    on_disk : dict of str to int
        The size on disk of each checkpoint, by name (its record says what
        it should be).
    """

    family: Family
    policy: RetentionPolicy | None = None
    reason: str | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    pointer: str | None = None
    alias: str | None = None
    on_disk: dict[str, int] = field(default_factory=dict)


@dataclass
class Stray:
    """A file that looks like a checkpoint but is not a committed one.

    Attributes
    ----------
    path : Path
        The file.
    family : str or None
        The family its name belongs to, where known.
    step : int or None
        The step its name encodes, where known.
    problem : str
        Why it does not count (no commit record, a malformed one, ...).
    """

    path: Path
    family: str | None
    step: int | None
    problem: str


@dataclass
class Inventory:
    """Everything :func:`read_inventory` found in a store directory.

    Attributes
    ----------
    directory : Path
        The store directory (absolute).
    manifest : Manifest or None
        Its manifest, if it has a readable one.
    families : list of FamilyView
        Its families; the primary one (the one ``latest`` means) first.
    strays : list of Stray
        Numbered files of its families that are not committed checkpoints.
    quarantined : list of Path
        Files in ``D/quarantine/`` (corrupt checkpoints moved aside), records
        excluded.
    archives : list of dp_ckpt_plugin.store.archive.ArchiveFolder
        Each folder of ``D/archive/`` (an earlier run), oldest first: its
        checkpoints and its size.
    warnings : list of str
        What could not be read.
    vanished : list of Path
        Numbered files listed that were gone when their record was read (a
        live store's retention removed them meanwhile): neither checkpoints
        nor strays.
    """

    directory: Path
    manifest: Manifest | None
    families: list[FamilyView]
    strays: list[Stray]
    quarantined: list[Path]
    archives: list[ArchiveFolder]
    warnings: list[str]
    vanished: list[Path] = field(default_factory=list)

    @property
    def format(self) -> str | None:
        """The format of its checkpoints, as the manifest or records say."""
        if self.manifest is not None:
            return self.manifest.format
        formats = {c.format for f in self.families for c in f.checkpoints}
        return formats.pop() if len(formats) == 1 else None

    def family(self, prefix: str) -> FamilyView | None:
        """The family of ``prefix``, or ``None``."""
        return next((f for f in self.families if f.family.prefix == prefix), None)

    def checkpoints(self) -> list[Checkpoint]:
        """Every committed checkpoint, family by family."""
        return [c for f in self.families for c in f.checkpoints]


def read_inventory(directory: Path, *, storage: Storage | None = None) -> Inventory:
    """Read what ``directory`` holds (see the module docs); it must exist."""
    directory = Path(os.path.abspath(directory))
    storage = storage or default_storage()
    warnings: list[str] = []
    try:
        manifest = read_manifest(directory, storage=storage)
    except InvalidRecordError as exc:
        manifest = None
        warnings.append(f"{exc}; families are read from the commit records")
    views: dict[str, FamilyView] = {}
    if manifest is not None:
        for info in manifest.families:
            views[info.family.prefix] = FamilyView(
                info.family, info.retention(), info.reason
            )
    listing = _listdir(directory, storage)
    strays = _find_families(directory, listing, views, storage)
    vanished: list[Path] = []
    for view in views.values():
        _fill(directory, view, strays, listing, storage, vanished)
    try:
        archives = archive_folders(directory, storage=storage)
    except UnreadableFileError as exc:
        archives = []
        warnings.append(f"{directory / ARCHIVE_DIR}: {exc}")
    return Inventory(
        directory=directory,
        manifest=manifest,
        families=_ordered(directory, views, manifest, storage),
        strays=sorted(strays.values(), key=lambda s: (s.family or "", s.step or 0)),
        quarantined=_payloads(directory / QUARANTINE_DIR, storage),
        archives=archives,
        warnings=warnings,
        vanished=vanished,
    )


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
    found = (
        storage.entry(directory)
        if directory.name in (ARCHIVE_DIR, QUARANTINE_DIR)
        else None
    )
    if found is not None and not found.is_dir:
        return {}
    with contextlib.suppress(UnreadableFileError):
        return dict(sorted(storage.names(directory)))
    return {}


def _find_families(
    directory: Path,
    listing: dict[str, str],
    views: dict[str, FamilyView],
    storage: Storage,
) -> dict[Path, Stray]:
    """Add the families the records and pointers name; return bad records."""
    strays: dict[Path, Stray] = {}
    for name in listing:
        target = record_target(name)
        if target is None:
            continue
        path = directory / target
        match = parse_numbered(target)
        try:
            record = read_record(path, storage=storage)
        except InvalidRecordError as exc:
            if listing.get(target) == "file":
                strays[path] = Stray(
                    path,
                    match.prefix if match else None,
                    match.step if match else None,
                    f"malformed commit record: {exc}",
                )
            continue
        if record is None or not target.startswith(f"{record.family}-"):
            continue
        suffix = target[len(f"{record.family}-{record.step}") :]
        if record.family not in views and suffix.startswith("."):
            with contextlib.suppress(ValueError):
                views[record.family] = FamilyView(Family(record.family, suffix))
    for name in listing:  # pointers: a store plain deepmd-kit wrote has no records
        if name != POINTER_NAME and not name.startswith(f"{POINTER_NAME}."):
            continue
        with contextlib.suppress(UnsafePointerError, ValueError):
            named = read_pointer(directory / name, storage=storage)
            match = parse_numbered(named.name) if named else None
            if match and match.prefix not in views:
                views[match.prefix] = FamilyView(
                    Family(match.prefix, match.suffix, name)
                )
    return strays


def _fill(
    directory: Path,
    view: FamilyView,
    strays: dict[Path, Stray],
    listing: dict[str, str],
    storage: Storage,
    vanished: list[Path],
) -> None:
    """Read a family's committed checkpoints, pointer, alias and strays."""
    fam = view.family
    numbered = [
        directory / n
        for n, kind in listing.items()
        if kind == "file" and fam.step_of(n) is not None
    ]
    for path in numbered:
        try:
            record = read_record(path, storage=storage)
        except InvalidRecordError:
            continue  # reported among the strays already
        step = fam.step_of(path.name)
        if record is None and _gone(path, storage):
            vanished.append(path)
        elif record is None:
            strays[path] = Stray(path, fam.prefix, step, "no commit record")
        elif record.step != step or record.family != fam.prefix:
            strays[path] = Stray(
                path, fam.prefix, step, "its commit record describes another file"
            )
        else:
            view.checkpoints.append(Checkpoint(path, step, fam.prefix, record))
            with contextlib.suppress(UnreadableFileError):
                found = storage.entry(path)
                if found is not None:
                    view.on_disk[path.name] = found.size
    view.checkpoints.sort(key=lambda c: c.step)
    pointers = [fam.pointer]
    if fam.pointer == POINTER_NAME:  # found without a manifest: any pointer naming it
        pointers += [n for n in listing if n.startswith(f"{POINTER_NAME}.")]
    for name in pointers:
        named = named_by(
            directory, Family(fam.prefix, fam.suffix, name), storage=storage
        )
        if named["pointer"] is not None and fam.step_of(named["pointer"]) is not None:
            view.pointer = named["pointer"]
            break
    linked = named_by(directory, fam, storage=storage)["alias"]
    if linked and fam.step_of(linked) is not None:
        view.alias = linked


def _ordered(
    directory: Path,
    views: dict[str, FamilyView],
    manifest: Manifest | None,
    storage: Storage,
) -> list[FamilyView]:
    """The manifest's order; without one, the family ``D/checkpoint`` names first."""
    if manifest is not None:
        return list(views.values())
    named = None
    with contextlib.suppress(UnsafePointerError):
        found = read_pointer(directory / POINTER_NAME, storage=storage)
        named = found.name if found is not None else None
    primary = next(
        (p for p, v in views.items() if named and v.family.step_of(named) is not None),
        None,
    )
    return sorted(
        views.values(), key=lambda v: (v.family.prefix != primary, v.family.prefix)
    )


def _payloads(folder: Path, storage: Storage, *, numbered: bool = False) -> list[Path]:
    """The regular files of ``folder`` that are not commit records.

    With ``numbered``, only numbered checkpoint names (an archive also holds
    the pointers and aliases of the run it keeps).
    """
    return [
        folder / n
        for n, kind in _listdir(folder, storage).items()
        if kind == "file"
        and not n.endswith(".commit.json")
        and (not numbered or parse_numbered(n) is not None)
    ]
