"""A store on object storage (``s3://bucket/run``) as the commands see it.

Everything is read through the store's HEAD (its catalogue segments
expanded) and commit records, never by listing; a key read from HEAD is one
of the store's own grammar (:func:`dp_ckpt_plugin.remote.keys.parse_key`)
or refused. ``check`` hashes a payload as it streams (nothing is written to
disk); ``fetch`` downloads one, verified, into a cache beside the staging
directories; ``prune`` holds the writer lease, as a training run would.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..checkpoint.digests import hasher
from ..checkpoint.records import CommitRecord
from ..errors import CheckpointError, RestartNotFoundError
from ..remote import head as heads
from ..remote.catalogue import SPILL, expand, leaves, write_segment
from ..remote.fetch import LATEST, candidates, fell_back, fetch_first, kept_input
from ..remote.head import Entry, Head
from ..remote.keys import owned, parse_key
from ..remote.lease import Lease, LeaseState
from ..storage.objects import ObjectStorage
from .views import Aside, Check, Decide, Listed, Listing, Resolution, Shelf, select

#: What a remote store says of its retention policy (HEAD records none).
NO_POLICY = "unknown (HEAD records no policy; prune takes one)"
#: What ``resolve`` says it checked: HEAD and the record, not the payload.
CHECKED = "its record agrees with HEAD (the payload is hashed when a run fetches it)"


class HeadView:
    """A store on object storage, read through its HEAD."""

    def __init__(self, storage: ObjectStorage) -> None:
        self.storage = storage
        self.where = storage.url

    def head(self) -> Head:
        """HEAD with its catalogue segments' entries (every kept entry)."""
        try:
            head, _ = heads.read(self.storage)
            if head is not None:
                head = expand(self.storage, head)
        except CheckpointError as exc:
            raise RestartNotFoundError(str(exc)) from None
        if head is None:
            raise RestartNotFoundError(
                f"{self.where} is not a checkpoint store (no HEAD)"
            )
        return head

    def listing(self, prefix: str | None = None, head: Head | None = None) -> Listing:
        head = head or self.head()
        families = [
            Shelf(
                name,
                [self._listed(name, entry, head.format) for entry in state.kept],
                latest=state.published.name if state.published else None,
                reason=NO_POLICY,
            )
            for name, state in head.families.items()
        ]
        return Listing(
            where=self.where,
            families=select(families, prefix, self.where),
            format=head.format,
            archives=[Aside(key, self.storage.url_of(key)) for key in head.archives],
            head=head,
            lease=self._lease(),
        )

    def _listed(self, family: str, entry: Entry, fmt: str | None) -> Listed:
        return Listed(
            name=entry.name,
            step=entry.step,
            family=family,
            size=entry.size,
            where=self.storage.url_of(entry.key),
            digest=entry.digest,
            metrics=entry.metrics,
            format=fmt,
            entry=entry,
        )

    def _lease(self) -> LeaseState | None:
        try:
            return Lease(self.storage).read()[0]
        except CheckpointError:
            return None

    def pointer_problems(self, listing: Listing) -> list[str]:
        """None: HEAD publishes one of its own entries or none."""
        return []

    def check(self, item: Listed, *, digest: bool) -> Check:
        problem, hashed = self.problem(item.entry, digest=digest)
        said = "" if problem is None else f"{item.where}: {problem}"
        return Check(item, said, hashed=hashed)

    def problem(self, entry: Entry, *, digest: bool) -> tuple[str | None, int]:
        """Record against HEAD, object size against record, then (with
        ``digest``) the payload hashed as it streams: what is wrong, if
        anything, and the bytes hashed."""
        from ..remote.fetch import record_of

        try:
            record = record_of(self.storage, entry)
            found = self.storage.head(entry.key)
            if found is None:
                return "missing", 0
            if found.size != record.size:
                return f"{found.size} bytes, its record says {record.size}", 0
            if not digest:
                return None, 0
            sink = _Hashing(record.algorithm)
            self.storage.download(entry.key, sink)
            if f"{record.algorithm}:{sink.hash.hexdigest()}" != record.digest:
                return "its content does not match the digest of its record", sink.size
            return None, sink.size
        except CheckpointError as exc:
            return str(exc), 0

    def resolve(self, spec: str, *, digest: bool) -> Resolution:
        """The first candidate whose payload is there at its size (one ``head``
        each), without downloading it."""
        head = self.head()
        defects: list[str] = []
        for found in candidates(self.storage, spec, _primary(head)):
            info = self.storage.head(found.entry.key)
            if info is not None and info.size == found.entry.size:
                found = fell_back(found, defects)
                item = self._listed(found.family, found.entry, head.format)
                return Resolution(
                    item=replace(item, created=found.record.created or None),
                    how=found.how,
                    checked=CHECKED,
                    record=found.record,
                    warnings=found.warnings,
                    fell_back=found.fell_back,
                    input=self._input(found.record),
                )
            what = "is missing" if info is None else f"holds {info.size} bytes"
            defects.append(
                f"{found.key_url} {what} (its commit record says {found.entry.size})"
            )
            if spec not in LATEST and spec != "best":
                raise RestartNotFoundError(defects[-1])
        raise RestartNotFoundError(
            f"no checkpoint of {self.where} is there whole: {'; '.join(defects)}"
        )

    def _input(self, record: CommitRecord) -> dict | None:
        """The training input a record names, from ``inputs/`` of the store."""
        origin = record.provenance
        if origin is None or origin.input is None:
            return None
        found = kept_input(self.storage, origin.input)
        return found and found[1]

    def fetch(self, spec: str) -> tuple[Path, str | None, list[str]]:
        from ..resolution.sources import RemoteSource
        from ..storage.local import LocalStorage
        from ..storage.staging import staging_dir

        cache = staging_dir(self.where, purpose="inspected")
        source = RemoteSource(self.storage, cache, LocalStorage(cache))
        found, path, warnings = fetch_first(
            self.storage, spec, _primary(self.head()), source
        )
        return path, self.storage.url_of(found.entry.key), warnings

    def prune(
        self, prefix: str | None, decide: Decide, *, dry_run: bool
    ) -> tuple[Listing, list[Listed]]:
        """Drop what ``decide`` picks from HEAD under the writer lease, then
        delete every key HEAD named before and does not now (only the store's
        own payloads and records)."""
        head = self.head()
        listing = self.listing(prefix, head)
        doomed = decide(listing)
        if dry_run or not doomed:
            return listing, doomed
        gone = [(c.family, c.entry) for c in doomed]
        lease = Lease(self.storage)
        epoch = lease.acquire(min_epoch=head.epoch + 1)
        try:
            swap = heads.update(self.storage, epoch, self._pruned(epoch, head, gone))
            before = head.referenced()
            after = expand(self.storage, swap.head).referenced()
            for key in sorted(before - after):
                if owned(key):  # HEAD's entries are of the grammar; checked again
                    self.storage.delete(key)
        finally:
            lease.release()
        return listing, doomed

    def _pruned(self, epoch: int, head: Head, gone: list[tuple[str, Entry]]):
        """The change of HEAD that drops ``gone``: from its entries, and from its
        catalogue segments by writing each touched one anew without them (a
        segment is never rewritten)."""
        doomed = {e.key for _, e in gone}
        swaps, n = [], head.seq + 1
        for prefix, state in head.families.items():
            for top in state.segments:
                entries = [
                    e for _, got in leaves(self.storage, prefix, top) for e in got
                ]
                if not doomed & {e.key for e in entries}:
                    continue
                rest = [e for e in entries if e.key not in doomed]
                new = []
                for at in range(0, len(rest), SPILL):
                    chunk = rest[at : at + SPILL]
                    new.append(write_segment(self.storage, epoch, n, prefix, chunk))
                    n = parse_key(new[-1].key).upload + 1
                swaps.append((prefix, top.key, new))

        def change(current):
            for prefix, entry in gone:
                current = current.without(prefix, [entry.key])
            for prefix, old, new in swaps:
                current = current.resegmented(prefix, [old], new)
            return current

        return change

    def release_lease(self) -> str | None:
        """Release a lease whose holder is gone (watched up to its time to live)."""
        return Lease(self.storage).clear()


def _primary(head: Head) -> str:
    """The family ``latest`` means in a remote store: its first (the periodic one)."""
    return next(iter(head.families), "model.ckpt")


class _Hashing:
    """A sink that hashes what a download writes and keeps nothing."""

    def __init__(self, algorithm: str) -> None:
        self.hash = hasher(algorithm)
        self.size = 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return len(data)
