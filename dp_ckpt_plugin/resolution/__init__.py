"""The front door of every restart: resolve, then verify, then broadcast.

:func:`resolve_restart` is the one front door: the API, training, freeze and
the ``dp-ckpt`` command all call it. It asks ``on_resolve_restart`` on the
chief rank (the built-in rules are :mod:`dp_ckpt_plugin.resolution.builtin`; a plugin may
answer first), *verifies what the answer names* (:func:`admit`), and
broadcasts the answer (or the error) to every rank. Whatever rule or plugin
proposed a checkpoint, a link is followed to the file it names and that file
is checked against its commit record at the level the context asks for
(rule 32 of ``docs/guarantees.md``); a :class:`Verifier` shared with the rules
hashes each file once. A file without a record is checked by the checksums
its own format carries (:mod:`dp_ckpt_plugin.formats.checksums`, rule 50),
over the bytes read for it.

A caller that will load the checkpoint asks for its bytes
(``ResolveContext.load``): the file is then opened once and read once, those
bytes are verified, and :attr:`Resolved.payload` hands the same bytes on to
every loader, so a file replaced after it was verified is never loaded.
Other ranks read the file once themselves and check it at the level the
chief did (:func:`payload_of`).

Warnings are returned (:attr:`Resolved.warnings`), never logged here: the
caller says them once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Protocol

from ..checkpoint import Checkpoint
from ..checkpoint.layout import Family, step_in_name
from ..checkpoint.records import (
    CommitRecord,
    check_payload,
    read_record,
    record_path,
    verify,
)
from ..errors import (
    CorruptCheckpointError,
    InvalidRecordError,
    RestartNotFoundError,
    UnreadableFileError,
)
from ..formats.checksums import Carried, check_carried
from ..ranks import Ranks, SingleProcess
from ..storage import PayloadBytes, Storage, default_storage, entry_or_none
from .sources import Origin, RemoteSource


class Proposer(Protocol):
    """What the front door asks for a proposal: :class:`~dp_ckpt_plugin.plugin.hooks.Hooks`."""

    def propose_restart(self, spec: str, context: ResolveContext) -> Resolved | None:
        """The first resolver's answer for ``spec``, or ``None``."""
        ...


class Verifier:
    """Checks checkpoints against their records, each file once per resolution.

    A file is identified by its real path, device, inode, size and time, so
    a file replaced meanwhile is checked again; the front door asks again
    for what a rule checked already, at no cost.

    With ``keep``, a file is checked by reading it whole from one opening
    (:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.read_payload`) and the bytes last found good are kept
    (:meth:`payload`): the caller loads exactly what was verified.

    A commit record is read once per resolution too (:meth:`record`): the rule
    that proposes a checkpoint and the front door that admits it share it.
    """

    def __init__(self, storage: Storage, *, keep: bool = False) -> None:
        self.storage = storage
        self.keep = keep
        self._done: dict[tuple, bool] = {}
        self._kept: tuple[tuple, bool, PayloadBytes] | None = None
        self._records: dict[Path, tuple[tuple, CommitRecord | None]] = {}

    def record(self, path: Path) -> CommitRecord | None:
        """:func:`~dp_ckpt_plugin.checkpoint.records.read_record`, remembered.

        Read again only when the record file changed meanwhile (its device,
        inode, size or time) or was never there.

        Raises
        ------
        InvalidRecordError
            When it exists but is malformed or describes another file.
        """
        found = entry_or_none(record_path(path), storage=self.storage)
        key = found and (found.dev, found.ino, found.size, found.mtime_ns)
        kept = self._records.get(path)
        if key and kept is not None and kept[0] == key:
            return kept[1]
        record = read_record(path, storage=self.storage)
        if key:
            self._records[path] = (key, record)
        return record

    def verify(self, path: Path, record: CommitRecord, *, digest: bool) -> None:
        """:func:`~dp_ckpt_plugin.checkpoint.records.verify`, remembered.

        Raises
        ------
        CorruptCheckpointError
            When it does not match its record.
        FileNotFoundError
            When it is gone.
        """
        if self.keep:
            self._read_checked(path, record, digest=digest)
            return
        found = self.storage.entry(path, follow=True)
        key = (
            self.storage.real(path),
            found and (found.dev, found.ino, found.size, found.mtime_ns),
            record.size,
            record.digest,
            record.replaces,
        )
        if key in self._done and (self._done[key] or not digest):
            return  # checked already, at this level or above
        verify(path, record, digest=digest, storage=self.storage)
        self._done[key] = digest

    def payload(
        self, path: Path, record: CommitRecord | None, *, digest: bool
    ) -> PayloadBytes:
        """The bytes of ``path``, checked against ``record`` (unchecked without one).

        The bytes :meth:`verify` kept when they are those of ``path`` and
        ``record``; otherwise the file is read now, once.

        Raises
        ------
        CorruptCheckpointError
            When they do not match the record.
        FileNotFoundError
            When it is gone.
        """
        if record is None:
            return read_payload(self.storage, path)
        return self._read_checked(path, record, digest=digest)

    def _read_checked(
        self, path: Path, record: CommitRecord, *, digest: bool
    ) -> PayloadBytes:
        key = (self.storage.real(path), record.size, record.digest, record.replaces)
        kept_key, kept_digest, kept = self._kept or (None, False, None)
        if kept_key == key and (kept_digest or not digest):
            return kept
        payload = read_payload(self.storage, path)
        check_payload(payload, record, digest=digest)
        self._kept = (key, digest, payload)  # the last one found good, only
        return payload


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
    remote : dp_ckpt_plugin.resolution.sources.RemoteSource or None
        The remote store the run's ``save_dir`` names, when it is one:
        ``latest``, ``best`` and its checkpoints' names are read from its
        HEAD and fetched into the staging directory.
    load : bool
        Whether the caller loads the checkpoint: then it is read whole from
        one opening, those bytes are verified and handed on
        (:attr:`Resolved.payload`).
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
    remote: RemoteSource | None = None  # for the remote resolver, never read here
    load: bool = False

    def __post_init__(self) -> None:
        self.storage = self.storage or default_storage()
        self.verifier = self.verifier or Verifier(self.storage, keep=self.load)

    @classmethod
    def of_store(
        cls, store, *, digest=False, cwd=None, family=None, load=False
    ) -> ResolveContext:
        """The context of a :class:`~dp_ckpt_plugin.store.core.CheckpointStore`.

        Its directory, the family's pointer mirrors as fallbacks, its storage,
        and its remote store (if it stages for one). Corrupt candidates are
        moved aside only by the chief.
        """
        cfg = store.family(family)
        return cls(
            family=cfg.family,
            store_dir=store.directory,
            cwd=cwd or Path.cwd(),
            fallback_pointers=tuple(m.path for m in cfg.mirrors if m.kind == "pointer"),
            digest=digest,
            quarantine=store.is_chief,
            storage=store.storage,
            load=load,
            remote=None if store.remote is None else store.remote.source(store),
        )

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
        ``"digest"`` or ``"size"`` (against its commit record); without a
        record, ``"checksums"`` (the checksums its format carries match) or
        ``"unverified"`` (it carries none).
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
    source : dp_ckpt_plugin.resolution.sources.Origin or None
        For a checkpoint of a remote store, where it came from (a
        :class:`dp_ckpt_plugin.remote.fetch.Found`: what HEAD and its record
        say of it); ``path`` is then its verified local copy.
    payload : PayloadBytes or None
        The checkpoint's bytes, read from one opening and verified, when the
        context asked to load it (on the chief only: it is not broadcast).
    carried : dp_ckpt_plugin.formats.checksums.Carried or None
        For a file without a commit record: what it carries to check itself,
        and what of it was checked.
    """

    checkpoint: Checkpoint
    checked: str
    how: str
    warnings: list[str] = field(default_factory=list)
    moved_aside: list[Path] = field(default_factory=list)
    rule: str = "plugin"
    via: Path | None = None
    fell_back: bool = False
    source: Origin | None = None
    payload: PayloadBytes | None = field(default=None, repr=False, compare=False)
    carried: Carried | None = None

    path = property(attrgetter("checkpoint.path"), doc="The checkpoint file.")
    step = property(attrgetter("checkpoint.step"), doc="Its step.")
    record = property(attrgetter("checkpoint.record"), doc="Its record, or ``None``.")


def resolve_restart(
    hooks: Proposer,
    spec: str,
    context: ResolveContext | None,
    ranks: Ranks | None = None,
) -> Resolved:
    """Resolve ``spec`` on the chief through ``on_resolve_restart``; verify; broadcast.

    ``context`` is used on rank 0 only (other ranks may pass ``None``), so only
    the chief touches the filesystem, and every rank gets the same checkpoint
    or raises the same error.
    """
    ranks = ranks or SingleProcess()
    outcome: tuple[Resolved | None, BaseException | None] = (None, None)
    admitted = None
    if ranks.rank == 0:
        try:
            found = hooks.propose_restart(spec, context)
            if found is None:
                raise RestartNotFoundError(f"no plugin resolved restart {spec!r}")
            admitted = admit(found, context)
            # the bytes stay on the chief: other ranks read their own
            outcome = (dataclasses.replace(admitted, payload=None), None)
        except Exception as exc:
            outcome = (None, exc)
    found, error = ranks.broadcast(outcome)
    if error is not None:
        raise error
    return admitted if admitted is not None else found


def admit(found: Resolved, ctx: ResolveContext) -> Resolved:
    """The front door's check of whatever a rule or plugin proposes.

    The file is followed through links to the checkpoint they name and
    checked as that checkpoint: its commit record is read and it is verified
    at the context's level (the size always, the digest when asked). A file
    without a record is read once and checked by the checksums its format
    carries (:func:`~dp_ckpt_plugin.formats.checksums.check_carried`); one
    that carries none is accepted unverified (with a warning when it is of
    no format known here).

    Raises
    ------
    RestartNotFoundError
        When the proposal names nothing, or a file whose record is malformed.
    CorruptCheckpointError
        When it does not match its record, or its own checksums.
    """
    if not isinstance(found, Resolved):
        raise RestartNotFoundError(
            f"a resolver plugin answered {type(found).__name__}, not a Resolved"
        )
    named = Path(os.path.abspath(ctx.cwd / found.path))
    path, via = follow_link(named, ctx.storage)
    entry = ctx.storage.entry(path, follow=True)
    if entry is None or not entry.is_file:
        what = "does not exist" if entry is None else f"is not a file ({entry.kind})"
        raise RestartNotFoundError(f"restart checkpoint {named} {what}")
    try:
        record = ctx.verifier.record(path)
    except InvalidRecordError as exc:
        raise RestartNotFoundError(
            f"{path} is not a committed checkpoint: {exc}"
        ) from None
    warnings = list(found.warnings)
    payload = carried = None
    checkpoint = Checkpoint(path, found.step, found.checkpoint.family)
    if record is not None or path.name != found.path.name:  # or a link named another
        checkpoint = checkpoint_at(path, record, ctx.family)
    checked = ctx.level
    try:
        if record is not None:
            ctx.verifier.verify(path, record, digest=ctx.digest)
            if ctx.load:
                payload = ctx.verifier.payload(path, record, digest=ctx.digest)
        else:
            read = ctx.verifier.payload(path, None, digest=ctx.digest)
            carried = check_carried(read)
            payload = read if ctx.load else None
    except FileNotFoundError:
        raise RestartNotFoundError(f"restart checkpoint {path} went away") from None
    if carried is not None:
        checked = "checksums" if carried.verified else "unverified"
        if carried.kind == "unknown":
            note = unrecorded_note(path)
            if note not in warnings:
                warnings.append(note)
    return Resolved(
        checkpoint=checkpoint,
        checked=checked,
        how=found.how,
        warnings=warnings,
        moved_aside=list(found.moved_aside),
        rule=found.rule,
        via=found.via or via,
        fell_back=found.fell_back,
        source=found.source,
        payload=payload,
        carried=carried,
    )


def checkpoint_at(
    path: Path, record: CommitRecord | None, family: Family
) -> Checkpoint:
    """``path`` as a checkpoint: as its record says, else as its name says."""
    if record is not None:
        return Checkpoint(path, record.step, record.family, record)
    ours = family.step_of(path.name) is not None
    step = step_in_name(path.name, family.suffix)
    return Checkpoint(path, step, family.prefix if ours else None)


def payload_of(found: Resolved, storage: Storage | None = None) -> PayloadBytes:
    """The bytes of a resolved checkpoint, to load: one opening, one read.

    The chief's, kept by the front door (``ResolveContext.load``); on
    another rank (or for a resolution that did not keep them) the file is
    read now and checked against its record at the level the front door
    checked it (``found.checked``), so no rank loads bytes that were not
    verified.

    Raises
    ------
    CorruptCheckpointError
        When the bytes read do not match the record.
    FileNotFoundError
        When the file is gone.
    """
    if found.payload is not None:
        return found.payload
    payload = read_payload(storage or default_storage(), found.path)
    if found.record is not None and found.checked != "unverified":
        check_payload(payload, found.record, digest=found.checked == "digest")
    elif found.record is None and found.checked == "checksums":
        check_carried(payload)
    return payload


def read_payload(storage: Storage, path: Path) -> PayloadBytes:
    """``storage.read_payload(path)``; a file it cannot read is a corrupt checkpoint."""
    try:
        return storage.read_payload(path)
    except UnreadableFileError as exc:
        raise CorruptCheckpointError(f"checkpoint {exc}") from None


def follow_link(path: Path, storage: Storage) -> tuple[Path, Path | None]:
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


def unrecorded_note(path: Path) -> str:
    """The warning for a file without a record that carries no known checksum."""
    return (
        f"{path} has no commit record and is not a zip archive, an HDF5 file nor "
        "a torch pickle, so it could not be verified (records are written for "
        "checkpoints saved to a save_dir)"
    )
