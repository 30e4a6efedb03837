"""Adopting numbered checkpoints that have no commit record.

A checkpoint written by a trainer without the plugin (plain deepmd-kit, say)
is a numbered file with no commit record: ``latest`` does not see it and
retention does not count it. Adopting it reads it once, checks that those
bytes load (through the ``on_load_step`` hook of its format) and writes the
commit record that describes them (their size and digest), so that from then
on it is a committed checkpoint like any other.

A file that does not load is reported and left without a record; a file whose
record exists but is malformed is never touched (the record is evidence).
Trainer-neutral: the deepmd-kit host (:mod:`dp_ckpt_plugin.deepmd.adopt`) and
the ``dp-ckpt adopt`` command both build on :func:`adopt_family`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pluggy

from ..checkpoint import Checkpoint
from ..checkpoint.catalogue import uncommitted
from ..checkpoint.layout import Family
from ..checkpoint.records import make_record, record_path, write_record
from ..plugin.hooks import Hooks
from ..storage import PayloadBytes, Storage, local_storage
from .lock import StoreLock


@dataclass
class Adoption:
    """What adopting one family found.

    Attributes
    ----------
    family : Family
        The family.
    format : str
        The format its files were loaded with.
    adopted : list of Checkpoint
        The files given a record (or that would be, in a dry run), oldest first.
    refused : list of tuple of Path and str
        The files that did not load, each with why; left without a record.
    malformed : list of Path
        The files whose record exists but is malformed; left alone.
    """

    family: Family
    format: str
    adopted: list[Checkpoint] = field(default_factory=list)
    refused: list[tuple[Path, str]] = field(default_factory=list)
    malformed: list[Path] = field(default_factory=list)


def why_not(exc: BaseException, path: Path | None = None) -> str:
    """Why a file does not load, in one short line (its first sentence).

    The file's own path, which the line around it names already, is cut to
    its name, so that what is wrong fits whatever the folder's length.
    """
    text = " ".join(str(exc).split())
    if path is not None:
        text = text.replace(str(path), path.name)
    return f"{type(exc).__name__}: {text.split('. ')[0][:160]}"


def adopt_family(
    directory: Path,
    family: Family,
    format: str,
    check: Callable[[PayloadBytes], None],
    *,
    storage: Storage,
    durable: bool = True,
    dry_run: bool = False,
) -> Adoption:
    """Give commit records to the numbered files of ``family`` that have none.

    The caller holds the store's lock (unless ``dry_run``: then nothing is
    written). Each file is read once; ``check`` raises when those bytes do
    not load, and the record describes them.
    """
    found = Adoption(family, format)
    paths = uncommitted(directory, family, storage=storage)
    for path in sorted(paths, key=lambda p: family.step_of(p.name) or 0):
        if storage.entry(record_path(path)) is not None:
            found.malformed.append(path)  # evidence, never overwritten
            continue
        step = family.step_of(path.name)
        try:
            payload = storage.read_payload(path)
            check(payload)
            record = make_record(
                path,
                step=step,
                family=family.prefix,
                format=format,
                storage=storage,
                payload=payload,  # the bytes that loaded, not the file again
            )
            record.check()  # a step above the bound: not a record to write
        except Exception as exc:
            found.refused.append((path, why_not(exc, path)))
            continue
        if not dry_run:
            write_record(path, record, durable=durable, storage=storage)
        found.adopted.append(Checkpoint(path, step, family.prefix, record))
    return found


def adopt_directory(
    directory: Path,
    families: Iterable[tuple[Family, str]],
    pm: pluggy.PluginManager,
    *,
    dry_run: bool = False,
    durable: bool = True,
) -> list[Adoption]:
    """Adopt the files of each ``(family, format)`` of ``directory``.

    Each file is checked by loading it through ``on_load_step`` of its format.
    Unless ``dry_run``, the store's lock is held while records are written
    (:class:`~dp_ckpt_plugin.errors.StoreLockedError` if a run holds it).
    """
    storage = local_storage(directory)
    hooks = Hooks.of(pm)
    with nullcontext() if dry_run else StoreLock(directory, storage=storage):
        return [
            adopt_family(
                directory,
                family,
                fmt,
                lambda payload, fmt=fmt: hooks.load_step(
                    fmt, payload.path, payload.reader()
                ),
                storage=storage,
                durable=durable,
                dry_run=dry_run,
            )
            for family, fmt in families
        ]
