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
(:mod:`.sweep`). Moves use ``os.replace`` into a folder made for this archive,
so nothing is ever overwritten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from .catalogue import Catalogue
from .checkpoint import Checkpoint
from .errors import CheckpointWriteError
from .layout import ARCHIVE_DIR, Family
from .pointers import link_or_pointer_target
from .records import record_path
from .storage import Storage

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
    n = 0
    while True:
        dest = root / (stamp if n == 0 else f"{stamp}-{n}")
        if storage.make_dir(dest, durable=durable):
            return dest
        n += 1


def earlier_run(
    committed: dict[Family, list[Checkpoint]], continues_from: Path | None
) -> list[Checkpoint]:
    """The checkpoints a run must archive before its first save.

    Parameters
    ----------
    committed : dict
        Every family of the store and its committed checkpoints.
    continues_from : Path or None
        The checkpoint inside the store the run continues from, if any: then
        only the checkpoints numbered above its step go; otherwise all do.
    """
    step = None
    if continues_from is not None:
        for family in committed:
            step = family.step_of(continues_from.name)
            if step is not None:
                break
    found = []
    for checkpoints in committed.values():
        found += [c for c in checkpoints if step is None or c.step > step]
    return found


def links_to_archive(
    directory: Path,
    families: Iterable[Family],
    archived: set[str],
    *,
    everything: bool,
    storage: Storage,
) -> list[Path]:
    """The in-store pointers and aliases that go with an archive.

    All of them when the whole earlier run goes (``everything``), otherwise
    those naming an archived checkpoint.
    """
    links = []
    for family in families:
        for link in (directory / family.pointer, directory / family.alias):
            named = link_or_pointer_target(link, storage=storage)
            if everything or (named and named in archived):
                links.append(link)
    return links


def archive_earlier_run(
    directory: Path,
    catalogue: Catalogue,
    continues_from: Path | None,
    *,
    storage: Storage,
    durable: bool = True,
) -> tuple[Path | None, list[Checkpoint]]:
    """Archive what an earlier run left in ``directory`` (see the module docs).

    Returns the archive folder (``None`` when nothing moved) and the
    checkpoints moved; they are dropped from ``catalogue``.
    """
    families = catalogue.families
    doomed = earlier_run(
        {f: sorted(catalogue.of(f).values(), key=lambda c: c.step) for f in families},
        continues_from,
    )
    names = {c.name for c in doomed}
    links = links_to_archive(
        directory, families, names, everything=continues_from is None, storage=storage
    )
    dest = archive(directory, doomed, links, storage=storage, durable=durable)
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
