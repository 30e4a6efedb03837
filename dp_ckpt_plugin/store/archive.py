"""Archiving the checkpoints of an earlier run instead of deleting them (rule 14).

Nothing in a store is deleted except by the retention window of the run
writing the family. A run that does not continue from a checkpoint inside the
store (a fresh run, one initialized from a checkpoint, a restart from
elsewhere) and finds committed checkpoints of an earlier run moves them,
with their records and the families' pointers and aliases, into
``D/archive/<UTC time>/`` before its first save. A run that continues from a
checkpoint of step ``s`` archives the checkpoints numbered above ``s`` (the
abandoned branch of a longer run) the same way.

Each checkpoint's payload moves before its record; a kill in between leaves a
record whose payload is in the archive, which the next open moves after it
(``sweep.py``). Moves use ``os.replace`` into a folder made for this archive,
so nothing is ever overwritten.

Archives are kept until someone removes them: :func:`archive_folders` says
what each holds and its size, :func:`archives_beyond` which a count or an age
would remove, and :func:`remove_archive` removes one folder through the
storage (``dp-ckpt prune --archives``, holding the store's lock; a store
built with ``max_archives`` at the start of each run, after archiving).
"""

from __future__ import annotations

import calendar
import itertools
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.layout import ARCHIVE_DIR, record_name
from ..checkpoint.pointers import link_or_pointer_target
from ..checkpoint.records import record_path
from ..errors import CheckpointWriteError
from ..storage import Storage, entries_of
from .catalogue import Catalogue

log = logging.getLogger("dp_ckpt_plugin")


def archive(
    directory: Path,
    checkpoints: Iterable[Checkpoint],
    links: Iterable[Path] = (),
    *,
    storage: Storage,
    durable: bool = True,
) -> Path | None:
    """Move ``checkpoints`` (and ``links``: pointers, aliases) into a new archive.

    Returns the archive folder, or ``None`` when there was nothing to move.

    Raises
    ------
    CheckpointWriteError
        Naming the file and the cause; what was moved stays in the archive.
    """
    checkpoints = list(checkpoints)
    links = [p for p in links if storage.entry(p) is not None]
    if not checkpoints:
        return None
    dest = new_archive_folder(directory, storage=storage, durable=durable)
    # payloads first, made durable, then records, pointers and aliases: a
    # crash in between leaves records in D whose payload is in the archive,
    # which the next open moves after them (never a payload without its
    # record in D, which no rule would touch again)
    payloads = [c.path for c in checkpoints]
    records = [record_path(c.path) for c in checkpoints]
    for batch in (payloads, [*records, *links]):
        for source in batch:
            storage.rename(source, dest / source.name)
        if durable:
            storage.sync_dir(dest, holding=batch)
            storage.sync_dir(directory, holding=batch)
    return dest


def new_archive_folder(
    directory: Path, *, storage: Storage, durable: bool = True
) -> Path:
    """Create ``D/archive/<UTC time>[-n]/``, a folder no one else has.

    ``D/archive`` must be a directory of ``D`` itself: a link there (to
    anywhere) or a file of that name is refused, since the store moves
    nothing out of ``D``.
    """
    root = directory / ARCHIVE_DIR
    found = storage.entry(root)
    if found is not None and not found.is_dir:
        what = "a link" if found.kind == "link" else f"a {found.kind}"
        raise CheckpointWriteError(
            f"could not archive the earlier run in {directory}: {root} exists and "
            f"is {what}, not a directory of the store (the store moves nothing "
            "outside its own directory); move it away"
        )
    if found is None:
        storage.make_dir(root, durable=durable)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in itertools.count():
        dest = root / (stamp if n == 0 else f"{stamp}-{n}")
        if storage.make_dir(dest, durable=durable):
            return dest


def archive_earlier_run(
    catalogue: Catalogue, continues_from: Path | None
) -> tuple[Path | None, list[Checkpoint]]:
    """Archive what an earlier run left in the catalogue's store (see the module docs).

    Returns the archive folder (``None`` when nothing moved) and the
    checkpoints moved; they are dropped from ``catalogue``. A run that
    continues from a checkpoint of the store archives those numbered above
    its step, with the pointers and aliases naming one of them; any other run
    archives every committed checkpoint, pointer and alias.
    """
    place, families = catalogue.place, catalogue.families
    directory, storage = place.directory, place.storage
    step = None
    for family in families if continues_from is not None else ():
        step = family.step_of(continues_from.name)
        if step is not None:
            break
    doomed = [
        c
        for family in families
        for c in sorted(catalogue.of(family).values(), key=lambda c: c.step)
        if step is None or c.step > step
    ]
    names = {c.name for c in doomed}
    links = [
        link
        for family in families
        for link in (directory / family.pointer, directory / family.alias)
        if continues_from is None
        or link_or_pointer_target(link, storage=storage) in names
    ]
    dest = archive(directory, doomed, links, storage=storage, durable=place.durable)
    if dest is not None:
        log.info(
            "archived %d checkpoint(s) of an earlier run (steps %s) to %s",
            len(doomed),
            ", ".join(map(str, sorted({c.step for c in doomed}))),
            dest,
        )
    by_prefix = {f.prefix: f for f in families}
    for checkpoint in doomed:
        catalogue.discard(by_prefix[checkpoint.family], checkpoint.name)
    return dest, doomed


# -- keeping archives in bounds -----------------------------------------------------

#: An archive folder's name: its UTC time, and ``-n`` when that time was taken.
_FOLDER_NAME = re.compile(r"(\d{8}T\d{6}Z)(?:-(\d+))?")


@dataclass
class ArchiveFolder:
    """One folder of ``D/archive/``: what an earlier run left.

    Attributes
    ----------
    name : str
        Its name (``20261130T161500Z``, ``...-1``).
    path : Path
        The folder.
    created : float
        When it was made (Unix time): from its name, else its modification
        time.
    size : int
        Bytes of the files in it (checkpoints, records, pointers).
    checkpoints : list of str
        The checkpoints in it (the files with a commit record beside them).
    """

    name: str
    path: Path
    created: float
    size: int = 0
    checkpoints: list[str] = field(default_factory=list)


def archive_folders(directory: Path, *, storage: Storage) -> list[ArchiveFolder]:
    """The archive folders of ``directory``, oldest first.

    Nothing when ``D/archive`` is absent, or is a link or a file (the store
    never follows it).
    """
    root = directory / ARCHIVE_DIR
    found = storage.entry(root)
    if found is None or not found.is_dir:
        return []
    folders = []  # ((created, the number after the stamp), folder)
    for name, kind in storage.names(root):
        if kind != "dir":
            continue
        path = root / name
        listed = _listed(path, storage)
        stamp = _FOLDER_NAME.fullmatch(name)
        if stamp:
            created = calendar.timegm(time.strptime(stamp[1], "%Y%m%dT%H%M%SZ"))
        else:  # not named by the store: its modification time
            entry = storage.entry(path)
            created = (entry.mtime_ns if entry else 0) / 1e9
        files = [n for n, (kind, _) in listed.items() if kind == "file"]
        size = sum(size for _, size in listed.values())
        payloads = sorted(n for n in files if record_name(n) in listed)
        order = int(stamp[2] or 0) if stamp else 0
        folder = ArchiveFolder(name, path, float(created), size, payloads)
        folders.append(((folder.created, order), folder))
    folders.sort(key=lambda keyed: keyed[0])
    return [folder for _, folder in folders]


def archives_beyond(
    folders: list[ArchiveFolder],
    *,
    keep_last: int | None = None,
    older_than_days: float | None = None,
    now: float | None = None,
) -> list[ArchiveFolder]:
    """The folders (oldest first) a count or an age removes.

    ``keep_last`` keeps the newest that many; ``older_than_days`` removes
    those made longer ago than that. Given both, a folder goes when either
    removes it; given neither, none goes.
    """
    now = time.time() if now is None else now
    doomed = set()
    if keep_last is not None:
        doomed |= {f.name for f in folders[: max(len(folders) - keep_last, 0)]}
    if older_than_days is not None:
        limit = now - older_than_days * 86400
        doomed |= {f.name for f in folders if f.created < limit}
    return [f for f in folders if f.name in doomed]


def remove_archive(
    folder: ArchiveFolder, *, storage: Storage, durable: bool = True
) -> bool:
    """Remove an archive folder and what the store put in it.

    Payloads go first, then records, pointers and aliases (a link itself,
    never its target), then the folder. Something else inside (a directory)
    is left, and so is the folder: ``False``.
    """
    listed = _listed(folder.path, storage)
    payloads = [n for n in folder.checkpoints if n in listed]
    rest = [n for n, (kind, _) in listed.items() if kind in ("file", "link")]
    for name in [*payloads, *(n for n in rest if n not in payloads)]:
        storage.remove(folder.path / name)
    if durable:
        storage.sync_dir(folder.path)
    gone = storage.remove_dir(folder.path)
    if gone and durable:
        storage.sync_dir(folder.path.parent, holding=[folder.path])
    return gone


def prune_archives(
    directory: Path,
    keep_last: int | None,
    storage: Storage,
    spare: Iterable[Path] = (),
    durable: bool = True,
) -> list[ArchiveFolder]:
    """Remove the archive folders beyond the newest ``keep_last``; return them.

    A folder in ``spare`` (the one holding the checkpoint a run starts from)
    is never removed. ``None`` keeps them all.
    """
    if keep_last is None:
        return []
    spare = {storage.real(p) for p in spare}
    folders = archive_folders(directory, storage=storage)
    beyond = archives_beyond(folders, keep_last=keep_last)
    doomed = [f for f in beyond if storage.real(f.path) not in spare]
    removed = [f for f in doomed if remove_archive(f, storage=storage, durable=durable)]
    if removed:
        log.info(
            "removed %d archive(s) of earlier runs beyond the newest %d (%s), %.1f MB",
            len(removed),
            keep_last,
            ", ".join(f.name for f in removed),
            sum(f.size for f in removed) / 1e6,
        )
    return removed


def _listed(folder: Path, storage: Storage) -> dict[str, tuple[str, int]]:
    """Name to (kind, size) of the entries of ``folder``; links not followed."""
    found = {}
    for name, kind in entries_of(folder, storage):
        entry = storage.entry(folder / name)
        found[name] = (kind, entry.size if entry is not None and kind == "file" else 0)
    return found
