"""HEAD: the one object that says what a remote store holds.

HEAD is a small JSON object: for each family the committed checkpoints kept
(key, name, step, size, digest, metrics) and the key of the published one,
the archives of earlier runs, the epoch of the writer that last moved it and
a sequence number that grows with every move. It is the remote store's
catalogue, pointer and alias at once: one ``get`` finds the latest
checkpoint whether the store keeps ten or two thousand, and no listing is
needed.

HEAD moves only by compare-and-swap (:func:`update`): read it with its
version, compute the next HEAD, ``put_if_match`` that version. Each change is
idempotent (adding an entry already there, dropping one already gone), so a
swap whose answer was lost and is tried again does no harm. A writer whose
epoch is below HEAD's was fenced off by a newer writer: :func:`update` raises
:class:`FencedError` and changes nothing. Nothing is deleted except what a
successful swap stopped naming (``Head.referenced``), so a writer paused
between reading and deleting can never remove what a newer writer relies on.

HEAD is read as untrusted input (rule 30): every field is checked by type,
range and size; anything else is a :class:`~dp_ckpt_plugin.errors.InvalidRecordError`
naming the URL.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from ..checkpoint.limits import (
    MAX_HEAD_BYTES,
    MAX_INT,
    MAX_LINEAGE,
    MAX_SEGMENT_LEVEL,
    MAX_SEGMENTS,
    check_size,
    is_int,
    is_text,
    is_time,
)
from ..checkpoint.lineage import Link
from ..checkpoint.records import (
    _check_digest,
    check_metrics,
    load_json,
)
from ..errors import CheckpointWriteError, InvalidRecordError
from ..storage.objects import (
    KeyExistsError,
    ObjectStorage,
    VersionMismatchError,
)
from ..text import shown
from .keys import ARCHIVE, HEAD_KEY, PAYLOAD, SEGMENT, parse_key, record_key

#: Version of the HEAD format this package writes and reads.
HEAD_FORMAT_VERSION = 1
#: Times a swap is tried again after HEAD changed under it.
SWAP_ATTEMPTS = 8


class FencedError(CheckpointWriteError):
    """This writer lost the store to a newer one (or its lease ran out).

    It may not move HEAD nor delete anything any more.
    """

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"{url}: {detail}; this run moves nothing there any more")


_SAYING = threading.Lock()


def say_once(exc: CheckpointWriteError, logger: logging.Logger) -> None:
    """Log ``exc``'s line at error level unless it was said already; mark it said."""
    with _SAYING:
        said, exc.said = exc.said, True
    if not said:
        logger.error("%s", exc)


def took_over(epoch: int, newer: int, who: str = "") -> str:
    """How a :class:`FencedError` says another run took over."""
    by = f" ({who})" if who else ""
    return (
        f"another run took the store over{by}, epoch {newer} after this run's {epoch}"
    )


@dataclass(frozen=True)
class Entry:
    """One committed checkpoint of a remote store.

    Attributes
    ----------
    key : str
        Its payload's key (the record is at ``keys.record_key(key)``).
    name : str
        Its file name (``model.ckpt-30.pt``): what it is called when fetched.
    step : int
        Its step.
    size : int
        Its size in bytes.
    digest : str
        ``"<algorithm>:<hex>"`` of the payload.
    metrics : dict or None
        What the trainer reported with it.
    """

    key: str
    name: str
    step: int
    size: int
    digest: str
    metrics: dict[str, float | None] | None = field(default=None, hash=False)

    def to_dict(self) -> dict:
        """Its fields, less ``metrics`` when it has none."""
        return {
            k: v for k, v in asdict(self).items() if k != "metrics" or v is not None
        }

    @property
    def keys(self) -> tuple[str, str]:
        """Its payload's and its record's keys."""
        return self.key, record_key(self.key)


@dataclass(frozen=True)
class Segment:
    """A catalogue segment HEAD names: an object of older kept entries.

    Attributes
    ----------
    key : str
        Its key (``catalogue/e<epoch>-<n>.json``), written once, never rewritten.
    count : int
        How many entries it holds (with the segments it names).
    first, last : int
        The lowest and highest step among them.
    level : int
        0 for a segment of entries; ``n`` > 0 for one naming segments of
        level ``n - 1``.
    """

    key: str
    count: int
    first: int
    last: int
    level: int = 0

    def to_dict(self) -> dict:
        """Its fields, less ``level`` at level 0."""
        return {k: v for k, v in asdict(self).items() if k != "level" or v}

    @classmethod
    def parse(cls, item: object) -> Segment | None:
        """A segment's description read from HEAD or a segment, or ``None``."""
        fields = {"key", "count", "first", "last"}
        if type(item) is not dict or set(item) not in (fields, fields | {"level"}):
            return None
        segment = cls(**item)
        numbers = (segment.count, segment.first, segment.last)
        if not (
            _is(segment.key, SEGMENT)
            and all(is_int(n) for n in numbers)
            and is_int(segment.level, MAX_SEGMENT_LEVEL)
        ):
            return None
        return segment

    def holds(self, step: int) -> bool:
        """Whether an entry of ``step`` may be in it."""
        return self.first <= step <= self.last


@dataclass(frozen=True)
class FamilyState:
    """A family in HEAD: what it keeps (by step), what it publishes, the
    name of its pointer in a local copy of the store, and the lineage of its
    newest entry (the segments of its chain, itself last; empty when unknown:
    ``checkpoint/lineage.py``). ``kept`` holds what retention may still
    delete, the published entry and the recent ones; ``segments`` name the
    catalogue segments holding the older kept entries (``catalogue.py``)."""

    kept: tuple[Entry, ...] = ()
    latest: str | None = None
    pointer: str | None = None
    lineage: tuple[Link, ...] = ()
    segments: tuple[Segment, ...] = ()

    @property
    def tip(self) -> Link | None:
        """The newest entry as a lineage names it, when HEAD knows its lineage."""
        newest = self.newest()
        if not self.lineage or newest is None:
            return None
        last = self.lineage[-1]
        if (last.step, last.digest) != (newest.step, newest.digest):
            return None
        return last

    def entry(self, key: str | None) -> Entry | None:
        """The kept entry of ``key``, or ``None``."""
        return next((e for e in self.kept if e.key == key), None)

    @property
    def published(self) -> Entry | None:
        """The entry the family publishes (its latest, or its best)."""
        return self.entry(self.latest)

    def newest(self) -> Entry | None:
        """The kept entry of the highest step."""
        return max(self.kept, key=lambda e: e.step, default=None)


@dataclass(frozen=True)
class Head:
    """What a remote store holds (see the module docs)."""

    seq: int = 0
    epoch: int = 0
    format: str | None = None
    families: Mapping[str, FamilyState] = field(default_factory=dict)
    archives: tuple[str, ...] = ()
    updated: float = 0.0
    #: Whether its families' ``kept`` hold their segments' entries too (read
    #: by ``catalogue.expand`` for a reader; never written), and the keys of
    #: the segments its segments name.
    expanded: bool = field(default=False, compare=False)
    nested: frozenset[str] = field(default=frozenset(), compare=False)

    # -- reading ---------------------------------------------------------------
    def family(self, prefix: str) -> FamilyState:
        """The state of ``prefix`` (empty when HEAD has none)."""
        return self.families.get(prefix, FamilyState())

    def find(self, name: str) -> tuple[str, Entry] | None:
        """The family and entry of the kept checkpoint named (or keyed) ``name``."""
        for prefix, state in self.families.items():
            for entry in state.kept:
                if name in (entry.name, entry.key):
                    return prefix, entry
        return None

    def referenced(self) -> set[str]:
        """Every key HEAD names: kept payloads and their records, segments, archives.

        Of a HEAD not :attr:`expanded`, the entries its segments hold are not
        among them.
        """
        keys = set(self.archives) | self.nested
        for state in self.families.values():
            keys.update(s.key for s in state.segments)
            for entry in state.kept:
                keys.update(entry.keys)
        return keys

    @property
    def empty(self) -> bool:
        """Whether it names no checkpoint."""
        return not any(s.kept or s.segments for s in self.families.values())

    # -- changing (each change idempotent) ---------------------------------------
    def with_entry(
        self,
        prefix: str,
        entry: Entry,
        *,
        publish: str | None,
        pointer: str | None = None,
    ) -> Head:
        """Add ``entry`` to ``prefix`` (replacing one of its step); publish ``publish``."""
        state = self.family(prefix)
        kept = [e for e in state.kept if e.step != entry.step or e.key == entry.key]
        if all(e.key != entry.key for e in kept):
            kept.append(entry)
        kept.sort(key=lambda e: e.step)
        latest = publish if publish is not None else state.latest
        return self._with(
            prefix,
            replace(
                state, kept=tuple(kept), latest=latest, pointer=pointer or state.pointer
            ),
        )

    def with_lineage(self, prefix: str, chain: tuple[Link, ...]) -> Head:
        """Say ``chain`` is the lineage of ``prefix``'s newest entry."""
        return self._with(prefix, replace(self.family(prefix), lineage=chain))

    def without(self, prefix: str, keys: Iterable[str]) -> Head:
        """Drop the entries of ``keys`` from ``prefix`` (never its published one)."""
        state = self.family(prefix)
        doomed = set(keys) - {state.latest}
        kept = tuple(e for e in state.kept if e.key not in doomed)
        return self._with(prefix, _lineage_kept(state, replace(state, kept=kept)))

    def archived(
        self,
        archive: str,
        keep: Callable[[str, Entry], bool],
        keep_segment: Callable[[str, Segment], bool] = lambda p, s: False,
    ) -> Head:
        """Move what ``keep`` (``keep_segment``) refuses out of every family into ``archive``."""
        families = {}
        for prefix, state in self.families.items():
            kept = tuple(e for e in state.kept if keep(prefix, e))
            latest = state.latest if any(e.key == state.latest for e in kept) else None
            if latest is None and kept:
                latest = kept[-1].key
            segments = tuple(s for s in state.segments if keep_segment(prefix, s))
            changed = replace(state, kept=kept, latest=latest, segments=segments)
            families[prefix] = _lineage_kept(state, changed)
        archives = (
            self.archives if archive in self.archives else (*self.archives, archive)
        )
        return replace(self, families=families, archives=archives)

    def spilled(self, prefix: str, segment: Segment, keys: Iterable[str]) -> Head:
        """Move the entries of ``keys`` from ``prefix``'s kept into ``segment``.

        All or none: unchanged when one of them is not kept (or is published).
        """
        state = self.family(prefix)
        keys = set(keys)
        if not keys <= {e.key for e in state.kept} or state.latest in keys:
            return self
        kept = tuple(e for e in state.kept if e.key not in keys)
        segments = (*state.segments, segment)
        return self._with(prefix, replace(state, kept=kept, segments=segments))

    def resegmented(
        self, prefix: str, old: Iterable[str], new: Iterable[Segment]
    ) -> Head:
        """Put the segments ``new`` in place of those keyed ``old`` (all or none)."""
        state = self.family(prefix)
        old = set(old)
        if not old <= {s.key for s in state.segments}:
            return self
        segments = [s for s in state.segments if s.key not in old]
        segments = sorted([*segments, *new], key=lambda s: (s.first, -s.level))
        return self._with(prefix, replace(state, segments=tuple(segments)))

    def _with(self, prefix: str, state: FamilyState) -> Head:
        return replace(self, families={**self.families, prefix: state})

    def advanced(self, epoch: int, format: str | None) -> Head:
        """The next HEAD, written by a writer of ``epoch``."""
        return replace(
            self,
            seq=self.seq + 1,
            epoch=max(epoch, self.epoch),
            format=format or self.format,
            updated=round(time.time(), 3),
        )

    # -- serialization -------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The JSON text HEAD is stored as.

        Raises
        ------
        ValueError
            When a field, or the whole of HEAD, is beyond what readers accept
            (``checkpoint/limits.py``), or HEAD was :attr:`expanded`.
        """
        if self.expanded:
            raise ValueError("an expanded HEAD is read, never written")
        data = {
            "what": "dp_ckpt_plugin remote store",
            "format_version": HEAD_FORMAT_VERSION,
            "seq": self.seq,
            "epoch": self.epoch,
            "format": self.format,
            "updated": self.updated,
            "families": {
                prefix: {
                    "latest": state.latest,
                    "pointer": state.pointer,
                    "kept": [e.to_dict() for e in state.kept],
                    "lineage": [link.to_list() for link in state.lineage],
                    "segments": [s.to_dict() for s in state.segments],
                }
                for prefix, state in self.families.items()
            },
            "archives": list(self.archives),
        }
        text = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
        check_size(text, "HEAD", MAX_HEAD_BYTES)
        try:  # what its readers refuse, the writer refuses: they are one parser
            Head.parse(text, "to be written")
        except InvalidRecordError as exc:
            raise ValueError(str(exc)) from None
        return text

    def check(self) -> None:
        """Refuse (``ValueError``) a field beyond what readers accept."""
        self.to_bytes()

    @classmethod
    def parse(cls, data: bytes, source: str) -> Head:
        """Read HEAD strictly; :class:`InvalidRecordError` naming ``source`` if malformed."""
        if len(data) > MAX_HEAD_BYTES:
            raise InvalidRecordError(
                f"HEAD {source} holds more than {MAX_HEAD_BYTES} bytes"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRecordError(f"HEAD {source} is not UTF-8 text") from None
        raw = load_json(text, source, "HEAD")
        if type(raw) is not dict:
            raise InvalidRecordError(f"HEAD {source} is not a JSON object")
        version = _field(raw, "format_version", source)
        if version > HEAD_FORMAT_VERSION:
            raise InvalidRecordError(
                f"HEAD {source} has format version {version}, newer than this plugin "
                f"reads ({HEAD_FORMAT_VERSION}); upgrade dp-ckpt-plugin"
            )
        seq, epoch, fmt, updated, families_raw = (
            _field(raw, key, source)
            for key in ("seq", "epoch", "format", "updated", "families")
        )
        families = {p: _family(s, p, source) for p, s in families_raw.items()}
        archives = _field(raw, "archives", source)
        return cls(seq, epoch, fmt, families, tuple(archives), float(updated))


#: HEAD's own fields: what each must be, its test, and what an absent one is.
_FIELDS: dict[str, tuple[str, Callable[[object], bool], object]] = {
    "format_version": ("a positive int", lambda v: type(v) is int and v >= 1, None),
    "seq": (f"an int between 0 and {MAX_INT}", is_int, None),
    "epoch": (f"an int between 0 and {MAX_INT}", is_int, None),
    "format": ("a short string", lambda v: v is None or is_text(v), None),
    "updated": ("a Unix time", is_time, 0.0),
    "families": ("an object", lambda v: type(v) is dict, None),
    "archives": (
        "a list of archive keys (archive/<UTC>.json)",
        lambda v: type(v) is list and all(_is(a, ARCHIVE) for a in v),
        [],
    ),
}


def _field(raw: Mapping, key: str, source: str):
    """HEAD's field ``key`` if it is what :data:`_FIELDS` says, else one line."""
    must, test, absent = _FIELDS[key]
    value = raw.get(key, absent)
    if not test(value):
        raise InvalidRecordError(f"HEAD {source}: {key!r} must be {must}")
    return value


def _is(key: object, kind: str, name: object = None) -> bool:
    """Whether ``key`` is a key of the store's grammar, of ``kind`` (and ``name``)."""
    parsed = parse_key(key)
    return (
        parsed is not None
        and parsed.kind == kind
        and (name is None or parsed.name == name)
    )


def _family(raw: object, prefix: object, source: str) -> FamilyState:
    if not is_text(prefix) or "/" in prefix or type(raw) is not dict:
        raise InvalidRecordError(
            f"HEAD {source}: a family must be a name and an object"
        )
    kept_raw = raw.get("kept")
    latest = raw.get("latest")
    pointer = raw.get("pointer")
    if type(kept_raw) is not list or not (latest is None or is_text(latest)):
        raise InvalidRecordError(
            f"HEAD {source}: family {prefix!r} must have a 'kept' list and a 'latest' key"
        )
    if pointer is not None and not (
        is_text(pointer) and "/" not in pointer and pointer not in (".", "..")
    ):
        raise InvalidRecordError(
            f"HEAD {source}: the pointer of family {prefix!r} must be a file name"
        )
    kept = parse_entries(kept_raw, prefix, source)
    if latest is not None and all(e.key != latest for e in kept):
        raise InvalidRecordError(
            f"HEAD {source}: family {prefix!r} publishes {shown(latest)}, which it does not keep"
        )
    lineage_raw = raw.get("lineage", [])
    links = (
        [Link.parse(i) for i in lineage_raw] if type(lineage_raw) is list else [None]
    )
    if len(links) > MAX_LINEAGE or any(link is None for link in links):
        raise InvalidRecordError(
            f"HEAD {source}: the lineage of family {prefix!r} must be at most "
            f"{MAX_LINEAGE} [epoch, step, digest] links"
        )
    segments = parse_segments(raw.get("segments", []), prefix, source)
    return FamilyState(tuple(kept), latest, pointer, tuple(links), segments)


def parse_entries(items: list, prefix: str, source: str) -> list[Entry]:
    """The entries of family ``prefix`` read strictly (from HEAD or a segment), by step."""
    kept = []
    for item in items:
        if type(item) is not dict:
            raise InvalidRecordError(
                f"HEAD {source}: an entry of {prefix!r} is not an object"
            )
        try:
            metrics = check_metrics(item.get("metrics"))
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(f"HEAD {source}: {exc}") from None
        fields = [item.get(name) for name in ("key", "name", "step", "size", "digest")]
        entry = Entry(*fields, metrics)
        if not _is(entry.key, PAYLOAD, entry.name):
            raise InvalidRecordError(
                f"HEAD {source}: an entry of family {prefix!r} names "
                f"{shown(entry.key)}, which is not a payload key this store writes "
                "(e<epoch>/<checkpoint name>); nothing is read or removed by it"
            )
        if not (is_int(entry.step) and is_int(entry.size) and is_text(entry.digest)):
            raise InvalidRecordError(
                f"HEAD {source}: a malformed entry in family {prefix!r}"
            )
        _check_digest(entry.digest, source)
        kept.append(entry)
    kept.sort(key=lambda e: e.step)
    return kept


def parse_segments(raw: object, prefix: str, source: str) -> tuple[Segment, ...]:
    """Segment descriptions read strictly (from HEAD or a segment)."""
    ok = type(raw) is list and len(raw) <= MAX_SEGMENTS
    found = [Segment.parse(item) for item in raw] if ok else []
    if not ok or None in found:
        raise InvalidRecordError(
            f"HEAD {source}: the segments of family {prefix!r} must be at most "
            f"{MAX_SEGMENTS} objects naming a segment key "
            "(catalogue/e<epoch>-<n>.json), a count, two steps and a level"
        )
    return tuple(found)


def _lineage_kept(before: FamilyState, after: FamilyState) -> FamilyState:
    """``after``, its lineage forgotten when its newest entry is another than before."""
    if before.newest() == after.newest():
        return after
    return replace(after, lineage=())


def read(storage: ObjectStorage) -> tuple[Head | None, str | None]:
    """HEAD and its version; ``(None, None)`` for a store that has none yet."""
    found = storage.get(HEAD_KEY, MAX_HEAD_BYTES)
    if found is None:
        return None, None
    data, info = found
    return Head.parse(data, storage.url_of(HEAD_KEY)), info.version


@dataclass(frozen=True)
class Swap:
    """A successful move of HEAD.

    Attributes
    ----------
    head : Head
        HEAD now.
    version : str
        Its version (what the next swap compares).
    before : Head
        The HEAD this swap replaced (exactly that version).
    """

    head: Head
    version: str
    before: Head

    def unnamed(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` that HEAD named before this swap and does not now.

        The only keys a writer may delete after it: no later HEAD names them
        again (every writer adds only objects it wrote itself, under its own
        epoch), whatever writer swaps HEAD next.
        """
        gone = self.before.referenced() - self.head.referenced()
        return {k for k in keys if k in gone}


def update(
    storage: ObjectStorage,
    epoch: int,
    change: Callable[[Head], Head],
    *,
    known: tuple[Head | None, str | None] | None = None,
    format: str | None = None,
) -> Swap:
    """Swap HEAD for ``change(HEAD)``, written by a writer of ``epoch``.

    ``known`` is HEAD as last read (saves a ``get`` when nobody else moved
    it).

    Raises
    ------
    FencedError
        When HEAD carries an epoch above ``epoch``: nothing was changed.
    CheckpointWriteError
        When HEAD kept changing under the swap.
    """
    head, version = known if known is not None else read(storage)
    url = storage.url_of(HEAD_KEY)
    for _ in range(SWAP_ATTEMPTS):
        current = head if head is not None else Head()
        if current.epoch > epoch:
            raise FencedError(storage.url, took_over(epoch, current.epoch))
        new = change(current).advanced(epoch, format)
        try:
            data = new.to_bytes()
        except ValueError as exc:
            raise CheckpointWriteError(f"could not move {url}: {exc}") from None
        try:
            if version is None:
                info = storage.put_if_absent(HEAD_KEY, data)
            else:
                info = storage.put_if_match(HEAD_KEY, data, version)
        except (VersionMismatchError, KeyExistsError):
            head, version = read(storage)
            continue
        return Swap(new, info.version, current)
    raise CheckpointWriteError(
        f"could not move {url}: it changed under every one of {SWAP_ATTEMPTS} attempts"
    )
