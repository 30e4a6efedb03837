"""Catalogue segments: HEAD stays small whatever a remote store keeps.

HEAD names, per family, the entries retention may still delete, the
published one and the :data:`RECENT` newest; the older kept entries that
retention keeps for good (:meth:`~dp_ckpt_plugin.retention.RetentionPolicy.settles`:
every entry of a keep-all family, the milestones of ``keep_every_n_steps``)
move, :data:`SPILL` at a time, into a *catalogue segment*: an object
``catalogue/e<epoch>-<n>.json`` written once (put-if-absent) and never
rewritten, which HEAD names with its count and its first and last step.
Once HEAD names :data:`FANOUT` segments of one level, the oldest of them are
named instead by one new segment of the next level (written once too). So
a save's swap of HEAD carries a bounded number of entries and a few dozen
segment names, and ``latest`` stays three requests (HEAD, record, payload)
whatever the store keeps.

Readers that need every entry (``dp-ckpt ls``, ``verify``, ``prune``,
``sync``, recovery) :func:`expand` HEAD: one ``get`` per segment. A
checkpoint named by its file name is found with one ``get`` per level, of
the segments whose steps hold it (:func:`find`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from ..checkpoint.layout import parse_numbered
from ..checkpoint.limits import MAX_SEGMENT_BYTES, check_size
from ..errors import InvalidRecordError
from ..storage.objects import KeyExistsError, ObjectStorage
from .head import Entry, FamilyState, Head, Segment, parse_entries, parse_segments
from .keys import segment_key

#: Entries a segment holds (the most a family's HEAD holds of settled entries).
SPILL = 128
#: Newest entries of a family that stay in HEAD.
RECENT = 16
#: Segments of one level HEAD names before they are named by one of the next.
FANOUT = 32
#: Names tried for a segment whose key exists.
SEGMENT_ATTEMPTS = 100
#: What a segment says it is.
WHAT = "dp_ckpt_plugin catalogue segment"


def segment_bytes(
    prefix: str, entries: Iterable[Entry] = (), children: Iterable[Segment] = ()
) -> bytes:
    """The JSON text of a segment of ``prefix`` holding ``entries`` (or naming
    ``children``, for a segment above level 0).

    Raises ``ValueError`` beyond what readers accept (``MAX_SEGMENT_BYTES``).
    """
    data = {"what": WHAT, "format_version": 1, "family": prefix}
    children = list(children)
    if children:
        data["segments"] = [c.to_dict() for c in children]
    else:
        data["entries"] = [e.to_dict() for e in entries]
    text = (json.dumps(data, sort_keys=True) + "\n").encode("utf-8")
    return check_size(text, "a catalogue segment", MAX_SEGMENT_BYTES)


def _read(storage: ObjectStorage, prefix: str, segment: Segment) -> dict:
    url = storage.url_of(segment.key)
    found = storage.get(segment.key, MAX_SEGMENT_BYTES)
    if found is None:
        raise InvalidRecordError(f"catalogue segment {url}, which HEAD names, is gone")
    try:
        raw = json.loads(found[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidRecordError(f"catalogue segment {url} is not JSON text") from None
    what = "segments" if segment.level else "entries"
    if (
        type(raw) is not dict
        or raw.get("what") != WHAT
        or raw.get("format_version") != 1
        or raw.get("family") != prefix
        or set(raw) != {"what", "format_version", "family", what}
    ):
        raise InvalidRecordError(
            f"catalogue segment {url} is not one of {prefix} at level {segment.level}"
        )
    return raw


def _agrees(storage, segment: Segment, items, count: int) -> None:
    steps = [i.first if isinstance(i, Segment) else i.step for i in items]
    lasts = [i.last if isinstance(i, Segment) else i.step for i in items]
    if count != segment.count or (
        items and (min(steps) != segment.first or max(lasts) != segment.last)
    ):
        raise InvalidRecordError(
            f"catalogue segment {storage.url_of(segment.key)} does not hold what "
            "HEAD says of it"
        )


def read_segment(storage: ObjectStorage, prefix: str, segment: Segment) -> list[Entry]:
    """The entries of a segment of level 0, read strictly (:class:`InvalidRecordError`)."""
    raw = _read(storage, prefix, segment)
    entries = parse_entries(raw["entries"], prefix, storage.url_of(segment.key))
    _agrees(storage, segment, entries, len(entries))
    return entries


def read_children(
    storage: ObjectStorage, prefix: str, segment: Segment
) -> list[Segment]:
    """The segments a segment above level 0 names, read strictly."""
    raw = _read(storage, prefix, segment)
    url = storage.url_of(segment.key)
    children = list(parse_segments(raw["segments"], prefix, url))
    if any(c.level != segment.level - 1 for c in children):
        raise InvalidRecordError(f"catalogue segment {url} names another level")
    _agrees(storage, segment, children, sum(c.count for c in children))
    return sorted(children, key=lambda c: c.first)


def leaves(
    storage,
    prefix: str,
    segment: Segment,
    step: int | None = None,
    newest=False,
    inner: set[str] | None = None,
):
    """``(segment, entries)`` of each level-0 segment under ``segment``, oldest
    first (``newest``: newest first, each read only when reached); only those
    whose steps may hold ``step`` when it is given. The keys of the segments
    above level 0 read on the way are added to ``inner``."""
    if step is not None and not segment.holds(step):
        return
    if segment.level == 0:
        yield segment, read_segment(storage, prefix, segment)
        return
    if inner is not None:
        inner.add(segment.key)
    children = read_children(storage, prefix, segment)
    for child in reversed(children) if newest else children:
        yield from leaves(storage, prefix, child, step, newest, inner)


def write_segment(
    storage: ObjectStorage,
    epoch: int,
    n: int,
    prefix: str,
    entries: list[Entry] = (),
    children: list[Segment] = (),
) -> Segment:
    """Write a new segment of ``entries`` (or naming ``children``), put-if-absent."""
    data = segment_bytes(prefix, entries, children)
    if children:
        level = children[0].level + 1
        count = sum(c.count for c in children)
        first, last = min(c.first for c in children), max(c.last for c in children)
    else:
        level, count = 0, len(entries)
        first, last = min(e.step for e in entries), max(e.step for e in entries)
    for again in range(SEGMENT_ATTEMPTS):
        key = segment_key(epoch, n + again)
        try:
            storage.put_if_absent(key, data)
        except KeyExistsError:
            continue
        return Segment(key, count, first, last, level)
    raise InvalidRecordError(
        f"could not write a catalogue segment under {storage.url_of(segment_key(epoch, n))}: "
        f"it and {SEGMENT_ATTEMPTS - 1} more names exist"
    )


def expand(storage: ObjectStorage, head: Head) -> Head:
    """HEAD with every family's segment entries in its ``kept`` (read, never written)."""
    if head.expanded or not any(s.segments for s in head.families.values()):
        return head
    families, nested = {}, set()
    for prefix, state in head.families.items():
        older = []
        for top in state.segments:
            for leaf, entries in leaves(storage, prefix, top, inner=nested):
                nested.add(leaf.key)
                older += entries
        inline = {e.key for e in state.kept}
        kept = sorted(
            [*(e for e in older if e.key not in inline), *state.kept],
            key=lambda e: e.step,
        )
        families[prefix] = replace(state, kept=tuple(kept))
    return replace(head, families=families, expanded=True, nested=frozenset(nested))


def find(storage: ObjectStorage, head: Head, name: str) -> tuple[str, Entry] | None:
    """The family and entry of the checkpoint named (or keyed) ``name``, if kept."""
    found = head.find(name)
    if found is not None:
        return found
    numbered = parse_numbered(name.rpartition("/")[2])
    if numbered is None:
        return None
    step = numbered[1]
    for prefix, state in head.families.items():
        for top in state.segments:
            for _, entries in leaves(storage, prefix, top, step):
                for entry in entries:
                    if name in (entry.name, entry.key):
                        return prefix, entry
    return None


def older(storage: ObjectStorage, prefix: str, state: FamilyState):
    """The entries of ``prefix``'s segments, newest first (read lazily)."""
    for top in sorted(state.segments, key=lambda s: s.last, reverse=True):
        for _, entries in leaves(storage, prefix, top, newest=True):
            yield from reversed(entries)


def spill_plan(state: FamilyState, policy, protected: set[str]) -> list[Entry]:
    """The entries to move into a new segment now: :data:`SPILL` of them, or none.

    Of those retention keeps for good (``policy.settles``), not published, not
    ``protected``, not among the :data:`RECENT` newest, oldest first; none of
    a ranked family (it publishes its best, which may be any).
    """
    settles = getattr(policy, "settles", None)
    if settles is None or getattr(policy, "ranked", False):
        return []
    recent = {e.key for e in state.kept[-RECENT:]}
    found = [
        e
        for e in state.kept
        if e.key not in recent
        and e.key != state.latest
        and e.name not in protected
        and settles(e.step)
    ]
    return found[:SPILL] if len(found) >= SPILL else []


def merge_plan(state: FamilyState) -> list[Segment]:
    """The :data:`FANOUT` oldest segments of the first level HEAD names that many of."""
    for level in sorted({s.level for s in state.segments}):
        same = [s for s in state.segments if s.level == level]
        same.sort(key=lambda s: s.first)
        if len(same) >= FANOUT:
            return same[:FANOUT]
    return []
