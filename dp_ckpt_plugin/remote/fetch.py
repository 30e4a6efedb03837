"""Reading a remote store: HEAD, then the record, then the payload, verified.

:func:`find` reads HEAD once and picks an entry: the published checkpoint of a
family (``latest``), the best one (``best``), or one named by file name or
key. Its commit record is read next and must agree with the entry (name,
step, size, digest). :func:`fetch` then downloads the payload into a local
directory under a temporary name, hashes it as it is written, and gives it
its name (with its record beside it) only when size and digest match; a
copy already there with the same record is used as it is. No listing is made,
so finding ``latest`` costs three requests whatever the store holds (its
older entries, in catalogue segments, are read only when everything newer
is unusable, or for a checkpoint named by its file name).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.digests import write_hashed
from ..checkpoint.limits import MAX_INPUT_BYTES
from ..checkpoint.provenance import input_path, parse_input
from ..checkpoint.records import (
    MAX_RECORD_BYTES,
    CommitRecord,
    read_record,
    write_record,
)
from ..errors import CorruptCheckpointError, InvalidRecordError, RestartNotFoundError
from ..resolution.sources import RemoteSource
from ..storage import Storage
from ..storage.objects import KeyMissingError, ObjectStorage, ObjectTooLargeError
from ..store.archive import archive
from . import head as heads
from .catalogue import find as find_entry
from .catalogue import older
from .head import Entry, Head
from .keys import record_key

#: Reads the commit record of a local file (``None``: it has none).
RecordReader = Callable[[Path], CommitRecord | None]

#: Specifications that mean "the published checkpoint of the family".
LATEST = ("latest", "")


@dataclass(frozen=True)
class Found:
    """An entry of a remote store, with its record checked against HEAD.

    Attributes
    ----------
    url : str
        The store's URL.
    family : str
        The family it belongs to.
    entry : dp_ckpt_plugin.remote.head.Entry
        What HEAD says of it.
    record : dp_ckpt_plugin.checkpoint.records.CommitRecord
        Its commit record (agreeing with the entry).
    how : str
        How it was found, for people.
    fell_back : bool
        Whether newer entries were unusable.
    warnings : tuple of str
        What was skipped on the way.
    """

    url: str
    family: str
    entry: Entry
    record: CommitRecord
    how: str
    fell_back: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def key_url(self) -> str:
        """The payload's URL."""
        return f"{self.url}/{self.entry.key}"


def read_head(storage: ObjectStorage) -> Head:
    """HEAD of the store, or :class:`RestartNotFoundError` naming the URL."""
    try:
        head, _ = heads.read(storage)
    except InvalidRecordError as exc:
        raise RestartNotFoundError(str(exc)) from None
    if head is None or head.empty:
        archives = ", ".join(head.archives[-3:]) if head is not None else ""
        raise RestartNotFoundError(
            f"{storage.url} holds no committed checkpoint (no HEAD names one)"
            + (f"; its earlier runs are archived in {archives}" if archives else "")
        )
    return head


def find(
    storage: ObjectStorage,
    spec: str,
    family: str,
    *,
    best_family: str | None = None,
) -> Found:
    """The entry ``spec`` names in the store, its record read and checked.

    The first of :func:`candidates`.
    """
    return next(iter(candidates(storage, spec, family, best_family=best_family)))


def candidates(
    storage: ObjectStorage,
    spec: str,
    family: str,
    *,
    best_family: str | None = None,
):
    """The entries ``spec`` may mean, best first, each with its record checked.

    ``spec`` is ``latest`` (or empty: the store itself), ``best`` (the
    published checkpoint of ``best_family``), or a checkpoint's file name or
    key.

    For ``latest`` and ``best``: the published entry, then the others newest
    first; one whose record is missing or disagrees is skipped, with a
    warning carried by the next (rule 20). A named entry is the only one.

    Raises
    ------
    RestartNotFoundError
        Naming the URL and what it holds.
    CorruptCheckpointError
        When a named entry's record is missing or disagrees.
    """
    head = read_head(storage)
    if spec in LATEST or spec == "best":
        prefix = family if spec != "best" else (best_family or "best.ckpt")
        state = head.family(prefix)
        if not state.kept and not state.segments:
            kept = ", ".join(sorted(p for p, s in head.families.items() if s.kept))
            raise RestartNotFoundError(
                f"{storage.url} keeps no checkpoint of {prefix} (it keeps {kept})"
            )
        order = [state.published] if state.published is not None else []
        order += [e for e in reversed(state.kept) if e is not state.published]
        order = chain(order, older(storage, prefix, state))  # read only if reached
        how = f"{'the best' if spec == 'best' else 'the latest'} {prefix} of HEAD"
        warnings: list[str] = []
        yielded = False
        for position, entry in enumerate(order):
            try:
                record = record_of(storage, entry)
            except CorruptCheckpointError as exc:
                warnings.append(f"{exc}{_OLDER}")
                continue
            yielded = True
            yield Found(
                storage.url, prefix, entry, record, how, position > 0, tuple(warnings)
            )
        if not yielded:
            raise RestartNotFoundError(
                f"no checkpoint of {prefix} in {storage.url} has a usable record: "
                + "; ".join(warnings)
            )
        return
    found = find_entry(storage, head, spec)
    if found is None:
        names = [e.name for s in head.families.values() for e in s.kept]
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise RestartNotFoundError(
            f"{storage.url} keeps no checkpoint named {spec}{hint} "
            f"(it keeps {', '.join(names[-5:])})"
        )
    prefix, entry = found
    yield Found(storage.url, prefix, entry, record_of(storage, entry), "by its name")


def fetch_first(
    storage: ObjectStorage,
    spec: str,
    family: str,
    source: RemoteSource,
    records: RecordReader | None = None,
) -> tuple[Found, Path, list[str]]:
    """Fetch the first of :func:`candidates` that downloads intact.

    Every defect of a newer checkpoint (its payload missing or not matching
    its record, its record missing, oversized, garbage or disagreeing) makes
    ``latest`` and ``best`` fall back to the next, with one warning naming
    both checkpoints (rule 20); nothing is moved (the remote store belongs to
    its writer). Returns what was found, its local copy and the warnings.
    ``records``: how a local copy's record is read (see :func:`fetch`).
    """
    defects: list[str] = []
    for found in candidates(storage, spec, family, best_family=source.best_family):
        try:
            path = fetch(
                storage,
                found,
                source.staging,
                source.local,
                durable=source.durable,
                records=records,
            )
        except CorruptCheckpointError as exc:
            if spec not in LATEST and spec != "best":
                raise
            defects.append(str(exc))
            continue
        found = fell_back(found, defects)
        return found, path, list(found.warnings)
    raise RestartNotFoundError(
        f"no checkpoint of {storage.url} downloads intact: "
        + ("; ".join(defects) or "none to try")
    )


#: What :func:`candidates` adds to the warning of an entry it skips.
_OLDER = "; trying an older one"


def fell_back(found: Found, defects: list[str]) -> Found:
    """``found`` with its one warning naming what was skipped and what it is."""
    skipped = [*(w.removesuffix(_OLDER) for w in found.warnings), *defects]
    if not skipped:
        return replace(found, warnings=())
    warning = (
        f"{'; '.join(skipped)}; fell back to {found.key_url} "
        f"(step {found.entry.step}), the newest usable checkpoint"
    )
    return replace(found, fell_back=True, warnings=(warning,))


def record_of(storage: ObjectStorage, entry: Entry) -> CommitRecord:
    """The commit record of ``entry``, which must agree with it."""
    url = storage.url_of(record_key(entry.key))
    try:
        got = storage.get(record_key(entry.key), MAX_RECORD_BYTES)
    except ObjectTooLargeError as exc:
        raise CorruptCheckpointError(
            f"commit record {url} is unusable: {exc.size} bytes, more than a record "
            f"holds ({exc.limit})"
        ) from None
    if got is None:
        raise CorruptCheckpointError(
            f"{storage.url_of(entry.key)} has no commit record"
        )
    try:
        record = CommitRecord.from_json(got[0].decode("utf-8"), source=url)
    except (InvalidRecordError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(
            f"commit record {url} is unusable: {exc}"
        ) from None
    if not (
        record.describes(entry.name)
        and record.step == entry.step
        and record.size == entry.size
        and record.digest == entry.digest
    ):
        raise CorruptCheckpointError(
            f"commit record {url} does not agree with HEAD about {entry.name}"
        )
    return record


def kept_input(storage: ObjectStorage, digest: str) -> tuple[bytes, dict] | None:
    """The training input of ``digest`` in ``inputs/`` of a remote store: its
    bytes and its value (``None``: not kept there, or other bytes)."""
    found = storage.get(input_path(Path(), digest).as_posix(), MAX_INPUT_BYTES)
    value = None if found is None else parse_input(found[0], digest)
    return None if value is None else (found[0], value)


def fetch(
    storage: ObjectStorage,
    found: Found,
    directory: Path,
    local: Storage,
    *,
    durable: bool = True,
    records: RecordReader | None = None,
) -> Path:
    """Download ``found`` into ``directory`` (verified); return the local file.

    A committed copy already there with the same record is used as it is
    (its record read by ``records``: the resolution's
    :meth:`~dp_ckpt_plugin.resolution.Verifier.record`, which the front door
    then reads it from, else
    :func:`~dp_ckpt_plugin.checkpoint.records.read_record`).
    Raises :class:`CorruptCheckpointError` when the bytes downloaded do not
    match the record; nothing is left behind then.
    """
    entry, record = found.entry, found.record
    path = directory / entry.name
    if local.entry(path) is not None:
        try:
            have = records(path) if records else read_record(path, storage=local)
        except InvalidRecordError:
            have = None
        present = local.entry(path, follow=True)
        if (
            have is not None
            and have.digest == record.digest
            and present is not None
            and present.size == record.size
        ):
            return path
        # another checkpoint under that name (one never uploaded, say): keep it
        other = Checkpoint(path, record.step, found.family, have)
        archive(directory, [other], storage=local, durable=durable)
    local.make_dirs(directory, durable=durable)
    missing: list[KeyMissingError] = []

    def pull(handle) -> None:
        try:
            storage.download(entry.key, handle)
        except KeyMissingError as exc:
            missing.append(exc)
            raise

    try:
        tmp, digest = write_hashed(path, pull, durable=durable, storage=local)
    except Exception:
        if missing:  # the store's defect, not a local write's
            raise CorruptCheckpointError(
                f"{found.key_url} is missing (HEAD and its commit record name it)"
            ) from None
        raise
    size = local.entry(tmp).size
    if size != record.size or digest != record.digest:
        local.remove_quietly(tmp)
        raise CorruptCheckpointError(
            f"{found.key_url} does not match its commit record "
            f"({size} bytes, {digest[:19]}… instead of {record.size} bytes, "
            f"{record.digest[:19]}…)"
        )
    write_record(path, record, durable=durable, storage=local)
    local.move_into_place(tmp, path, durable=durable)
    return path


def copy_here(found, directory: Path, local: Storage, storage=None, durable=True):
    """On a rank other than the chief: the chief's remote checkpoint, on this node.

    ``found`` is the chief's :class:`~dp_ckpt_plugin.resolution.Resolved`;
    the same entry is fetched (verified) into ``directory`` of this node,
    unless it is there already. Returns ``found`` naming the local copy.
    """
    from ..objectstore.registry import storage_for

    source = found.source
    storage = storage or storage_for(source.url)
    path = fetch(storage, source, directory, local, durable=durable)
    return replace(found, checkpoint=replace(found.checkpoint, path=path))
