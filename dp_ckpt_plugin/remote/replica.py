"""The writer side of a remote store: lease, uploads, HEAD, retention.

A :class:`RemoteStore` belongs to one :class:`~dp_ckpt_plugin.store.core.CheckpointStore`
whose directory is a local *staging* directory. The store commits every
checkpoint there first (the local protocol, unchanged: the loop's stall is
what it is with a local ``save_dir``) and hands it to :meth:`RemoteStore.submit`;
an uploader thread then, for each checkpoint, in this order:

1. checks the staged file against its commit record (size, digest) from the
   open file it then uploads, so a file replaced meanwhile is never sent
   under the old record;
2. puts the payload under a new key of this run's epoch (multipart where the
   storage does it, retried part by part);
3. creates its commit record if absent (a retry that finds it identical goes
   on);
4. swaps HEAD (one swap for every family of the step): the new entry kept
   and published, retention applied to what HEAD keeps;
5. deletes what that swap stopped naming, and nothing else;
6. renews the lease if a third of its time went by (at most once).

A checkpoint waiting for its upload is protected from the staging store's
retention. When uploads fall behind (a save every step on a slow link), the
uploader sends the newest checkpoint of each family and says, in one line,
which committed steps it skipped. A failed upload is retried with a growing
pause, the checkpoint staying committed in the staging directory; a newer
writer taking the store over, or HEAD turning out malformed, stops the run at
its next save with one line. :meth:`RemoteStore.close` waits a bounded time
for the uploads in flight, then says what did not make it and how to send it
(``dp-ckpt sync``), unless a newer run took the store over (then they are a
branch it does not continue: ``branches.py``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.digests import digest_of_view
from ..checkpoint.limits import MAX_INPUT_BYTES
from ..checkpoint.provenance import INPUTS_DIR, input_path
from ..checkpoint.records import CommitRecord
from ..errors import CheckpointError, CheckpointWriteError, UnreadableFileError
from ..resolution import Resolved
from ..resolution.sources import RemoteSource
from ..retention import Candidate, plan_prune
from ..storage import Storage
from ..storage.forks import OwnedLock
from ..storage.objects import (
    KeyExistsError,
    ObjectStorage,
    StorageUnavailableError,
)
from ..store.archive import archive
from ..store.family import FamilyConfig
from ..store.replica import Staging
from . import branches, catalogue
from . import head as heads
from .fetch import Found, copy_here, kept_input
from .head import Entry, FencedError, Head, say_once
from .keys import archive_key, owned, payload_key, record_key
from .lease import DEFAULT_TTL, Holder, Lease
from .probe import probe
from .recovery import recover

log = logging.getLogger("dp_ckpt_plugin")

#: Seconds :meth:`RemoteStore.close` waits for uploads in flight.
DEFAULT_UPLOAD_WAIT = 300.0
#: Longest pause between attempts of a failing upload.
MAX_RETRY_PAUSE = 30.0
#: Names tried for an archive made in the same second as others.
ARCHIVE_ATTEMPTS = 100
#: A backlog older than this many seconds is reported (at most this often).
BEHIND_REPORT = 30.0


class NotSent(Exception):
    """A queued checkpoint that cannot be uploaded (its staged file changed)."""


@dataclass
class _Job:
    """A committed checkpoint of the staging store, to upload."""

    config: FamilyConfig
    checkpoint: Checkpoint
    since: float


class RemoteStore:
    """The remote side of a store (see the module docs).

    Parameters
    ----------
    storage : dp_ckpt_plugin.storage.objects.ObjectStorage
        Where the remote store is.
    format : str
        The format of its checkpoints.
    staging : Storage, optional
        The staging store's local storage (to open staged files); the
        :class:`~dp_ckpt_plugin.store.core.CheckpointStore` it is given to sets it.
    ttl : float
        Seconds the writer lease holds without renewal.
    upload_wait : float
        Seconds :meth:`close` waits for uploads in flight.
    holder : dp_ckpt_plugin.remote.lease.Holder, optional
        Who this run is, in the lease (this process by default).
    """

    def __init__(
        self,
        storage: ObjectStorage,
        *,
        format: str,
        staging: Storage | None = None,
        ttl: float = DEFAULT_TTL,
        upload_wait: float = DEFAULT_UPLOAD_WAIT,
        holder: Holder | None = None,
    ) -> None:
        self.storage = storage
        self.format = format
        self.staging = staging
        self.upload_wait = upload_wait
        #: Seconds before a failed upload is tried again (doubling each time).
        self.first_pause = 1.0
        self.lease = Lease(storage, ttl=ttl, holder=holder)
        self.url = storage.url
        self.epoch: int | None = None
        self._head: tuple[Head | None, str | None] = (None, None)
        self._lock = threading.Condition()
        self._owner = OwnedLock(f"the remote store {self.url}")  # its threads'
        self._queue: list[_Job] = []
        self._closing = False
        self._fatal: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._uploads: dict[str, int] = {}
        self._resumed: dict[str, Entry] = {}
        self._continues_from: Entry | None = None
        self._continues_chain: tuple = ()
        self._behind_said = 0.0
        #: Names of the checkpoints being uploaded, by family (empty when idle).
        self._sending: dict[str, set[str]] = {}
        self._inputs_sent: set[str] = set()
        #: What the store should say once (a takeover, an unsafe endpoint).
        self.notes: list[str] = []
        #: Entries uploaded by this run, newest last (for the closing line).
        self.uploaded: list[Entry] = []
        #: Set once the start's recovery is over.
        self.recovered = threading.Event()

    # -- lifecycle -----------------------------------------------------------
    def start(self, store: Staging | None = None) -> None:
        """Check the endpoint, take the lease and fence HEAD (once).

        Then what the staging store ``store`` holds newer than HEAD (a run
        that crashed before its upload) is queued. What the start says (a
        takeover, an endpoint ignoring conditions) is logged as a warning.
        """
        if store is not None:
            self.staging = self.staging or store.place.storage
        self._begin()
        for note in self.notes:
            log.warning("%s", note)
        self.notes.clear()
        if store is None:
            return
        local = store.catalogue
        jobs = []
        for cfg in store.families.values():
            state = self.head.family(cfg.family.prefix)
            staged = branches.sort(state, local.of(cfg.family).values())
            if staged.dead:
                self._set_aside(store, cfg.family, state, staged.dead)
            if staged.newest is not None:
                jobs.append((cfg, staged.newest))
        if jobs:
            log.warning(
                "%s holds committed checkpoints newer than %s (%s): uploading them",
                local.place.directory,
                self.url,
                ", ".join(f"{c.family.prefix} step {cp.step}" for c, cp in jobs),
            )
            self.submit(jobs)
            # resolution, next, must see them in HEAD: a run resuming from an
            # older latest would fork what it then publishes (rule 47)
            self.flush(self.upload_wait)

    def _set_aside(self, store, family, state, dead) -> None:
        """Archive a dead branch in the staging directory, with its one line."""
        dest = archive(
            store.place.directory,
            dead,
            storage=store.place.storage,
            durable=store.place.durable,
        )
        for checkpoint in dead:
            store.catalogue.discard(family, checkpoint.name)
        said = branches.dead_line(
            self.url, family.prefix, state, dead, f"kept in {dest}"
        )
        log.warning("%s", said)

    def _begin(self) -> None:
        if self.epoch is not None:
            return
        unsafe = probe(self.storage)
        if unsafe is not None:
            self.notes.append(
                f"{self.url} does not enforce conditional writes ({unsafe}): "
                "dp_ckpt_plugin cannot keep two runs from writing it at once; "
                "run one writer at a time"
            )
        self._head = heads.read(self.storage)
        self.epoch = self.lease.acquire(min_epoch=self.head.epoch + 1)
        try:
            self._swap(lambda h: h)  # no writer of an older epoch moves HEAD now
        except BaseException:
            self.epoch = None  # not started, even if release raises
            self.lease.release()
            raise
        self.notes.extend(self.lease.notes)
        self.lease.start_heartbeat()
        self._thread = threading.Thread(
            target=self._run, name="dp_ckpt-upload", daemon=True
        )
        self._thread.start()

    @property
    def head(self) -> Head:
        """HEAD as this writer last saw it."""
        return self._head[0] or Head()

    def finish(self, staging: Path) -> None:
        """:meth:`close`, raising one line for what could not be uploaded."""
        if self.epoch is None:
            return
        left = self.close()
        if left and self.lease.lost is not None:
            # a newer run went on from HEAD: what is left is a branch it does not
            # continue, which no sync may publish (rule 47)
            raise CheckpointWriteError(
                f"{len(left)} checkpoint(s) of this run stay committed in {staging} "
                f"only ({', '.join(c.name for c in left)}): {self.url} was taken "
                "over by a newer run, which does not continue them; they are not "
                "to be sent there"
            )
        if left:
            names = ", ".join(str(c.path) for c in left)
            raise CheckpointWriteError(
                f"{len(left)} checkpoint(s) could not be uploaded to {self.url} in "
                f"time ({names}); they are committed in {staging}: `dp-ckpt sync "
                f"{staging} {self.url}` uploads them"
            )

    def source(self, store: Staging) -> RemoteSource:
        """What resolution reads this store as."""
        configs = store.families.values()
        leaders = [c for c in configs if getattr(c.policy, "leader", None) is not None]
        ranked = leaders[0].family.prefix if leaders else None
        place = store.place
        return RemoteSource(
            self.storage, place.directory, place.storage, place.durable, ranked
        )

    def close(self, *, wait: float | None = None) -> list[Checkpoint]:
        """Wait (bounded) for the uploads in flight; release the lease.

        Returns the checkpoints that were not uploaded (committed in the
        staging directory only); each is said in one line.
        """
        limit = self.upload_wait if wait is None else wait
        with self._lock:
            self._drain(time.monotonic() + limit)
            self._closing = True
            left = [j.checkpoint for j in self._queue]
            self._queue.clear()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.lease.release()
        self.epoch = None
        return left

    # -- the store's calls ------------------------------------------------------
    def check(self) -> None:
        """Raise what stopped the uploads for good (fenced, malformed HEAD)."""
        if self._fatal is not None:
            raise self._fatal
        self.lease.check()

    def submit(self, jobs: Sequence[tuple[FamilyConfig, Checkpoint]]) -> None:
        """Queue committed checkpoints of one step for upload (returns at once)."""
        self.check()
        now = time.monotonic()
        with self._lock:
            self._queue.extend(_Job(c, cp, now) for c, cp in jobs)
            self._lock.notify_all()

    def protected(self, prefix: str) -> set[str]:
        """Names of staged checkpoints of ``prefix`` not yet uploaded."""
        with self._lock:
            names = {
                j.checkpoint.name
                for j in self._queue
                if j.config.family.prefix == prefix
            }
            return names | self._sending.get(prefix, set())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued upload is done; ``False`` on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._owner.check()  # the upload thread is not in a forked child
        with self._lock:
            if not self._drain(deadline):
                return False
        self.check()
        return True

    def _drain(self, deadline: float | None) -> bool:
        """Wait (lock held) until no upload is queued nor running, or uploads
        stopped for good; ``False`` when ``deadline`` came first."""
        while (self._queue or self._sending) and self._fatal is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._lock.wait(min(remaining, 1.0) if remaining is not None else 1.0)
        return True

    def staged(self, found: Resolved, store: Staging, *, continues: bool) -> Resolved:
        """A resolved checkpoint of a remote store: on this rank's disk, protected.

        On the chief, a checkpoint of this store is the one the run starts
        from (protected from remote retention; with ``continues``, what lies
        above it is archived at the first save). On another rank, the same
        entry is fetched into this node's own directory.
        """
        source = found.source
        if not isinstance(source, Found):
            return found
        ours = source.url == self.url
        if not store.is_chief:
            place = store.place
            directory = place.directory if ours else found.path.parent
            storage = self.storage if ours else None
            return copy_here(found, directory, place.storage, storage, place.durable)
        if ours:
            self._resumed[source.family] = source.entry
            self._continues_from = source.entry if continues else None
            self._continues_chain = branches.chain_of_entry(source.entry, source.record)
            store.catalogue.invalidate()
        return found

    def start_run(self) -> str | None:
        """Archive what an earlier run left in HEAD (rule 14); return the archive key.

        A run that continues from an entry of this store archives the
        entries numbered above it; any other run archives every entry.
        Nothing is deleted: the archive names them.
        """
        self.check()
        continues_from = self._continues_from
        if continues_from is None:
            return self.archive(lambda prefix, e: False)
        step = continues_from.step
        return self.archive(
            lambda prefix, e: e.step <= step, lambda prefix, s: s.last <= step
        )

    def archive(self, keep, keep_segment=lambda p, s: False) -> str | None:
        """Move the entries of HEAD ``keep(prefix, entry)`` refuses into an archive.

        So too its catalogue segments ``keep_segment(prefix, segment)``
        refuses (whole: a segment is never rewritten). The archive
        (``U/archive/<UTC>.json``) names them, so nothing is deleted; returns
        its key, or ``None`` when nothing was to move.
        """
        head = self.head
        doomed = [e for p, s in head.families.items() for e in s.kept if not keep(p, e)]
        moved = {
            p: tuple(g for g in s.segments if not keep_segment(p, g))
            for p, s in head.families.items()
        }
        if not doomed and not any(moved.values()):
            return None
        gone = {e.key for e in doomed}
        families = {
            p: heads.FamilyState(
                tuple(e for e in s.kept if e.key in gone),
                s.latest if s.latest in gone else None,
                segments=moved[p],
            )
            for p, s in head.families.items()
        }
        archived = replace(head, families=families, archives=())
        now = time.time()
        data = archived.to_bytes()  # the same bytes under every name tried
        for again in range(ARCHIVE_ATTEMPTS):
            key = archive_key(now, again)
            try:
                self.storage.put_if_absent(key, data)
                break
            except KeyExistsError:
                continue
        else:
            raise CheckpointWriteError(
                f"could not archive the earlier run of {self.url}: "
                f"{self.storage.url_of(archive_key(now))} and "
                f"{ARCHIVE_ATTEMPTS - 1} more names exist"
            )
        self._swap(lambda h: self._relinked(h.archived(key, keep, keep_segment)))
        steps = sorted({e.step for e in doomed})
        spans = [f"{g.first}-{g.last}" for gs in moved.values() for g in gs]
        log.info(
            "archived %d checkpoint(s) of an earlier run of %s (steps %s) in %s",
            len(doomed) + sum(g.count for gs in moved.values() for g in gs),
            self.url,
            ", ".join([*spans, *map(str, steps)]),
            self.storage.url_of(key),
        )
        return key

    def _relinked(self, head: Head) -> Head:
        """``head`` knowing the lineage of a family's newest again when it is the
        entry this run continues from (archiving above it forgot it)."""
        entry, chain = self._continues_from, self._continues_chain
        if entry is None or not chain:
            return head
        for prefix, state in head.families.items():
            if state.newest() == entry and not state.lineage:
                head = head.with_lineage(prefix, chain)
        return head

    # -- the uploader thread ----------------------------------------------------
    def _run(self) -> None:
        try:  # first, what dead writers left (the only listing of a run)
            recover(self.storage, self.head, self.epoch, held_for=self.lease.held_for)
        except CheckpointError as exc:
            log.warning("%s: recovery skipped: %s", self.url, exc)
        finally:
            self.recovered.set()
        pause = self.first_pause
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                batch = self._take()
                self._sending = {p: {j.checkpoint.name} for p, j in batch.items()}
            try:
                self._upload(batch)
                pause = self.first_pause
            except FencedError as exc:
                self._fail(exc)
                return
            except NotSent as exc:  # a newer save of the step will follow, or none can
                log.warning("%s", exc)
            except (StorageUnavailableError, CheckpointWriteError, OSError) as exc:
                self._retry_later(batch, exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_PAUSE)
            except CheckpointError as exc:
                self._fail(exc)
                return
            except BaseException as exc:  # a bug: say it, stop uploading
                self._fail(
                    CheckpointWriteError(
                        f"uploads to {self.url} stopped: {type(exc).__name__}: {exc}"
                    )
                )
                raise
            finally:
                with self._lock:
                    self._sending = {}
                    self._lock.notify_all()

    def _take(self) -> dict[str, _Job]:
        """The jobs to upload now: the newest step of each family (lock held)."""
        by_family: dict[str, list[_Job]] = {}
        for job in self._queue:
            by_family.setdefault(job.config.family.prefix, []).append(job)
        self._queue.clear()
        batch = {}
        for prefix, jobs in by_family.items():
            newest = max(jobs, key=lambda j: j.checkpoint.step)
            skipped = sorted(
                {j.checkpoint.step for j in jobs} - {newest.checkpoint.step}
            )
            if skipped:
                log.warning(
                    "upload to %s is behind: %s step(s) %s, committed in %s, were "
                    "superseded before they could be uploaded; uploading step %d",
                    self.url,
                    prefix,
                    ", ".join(map(str, skipped)),
                    newest.checkpoint.path.parent,
                    newest.checkpoint.step,
                )
            batch[prefix] = newest
        oldest = min(j.since for jobs in by_family.values() for j in jobs)
        now = time.monotonic()
        if now - oldest > BEHIND_REPORT and now - self._behind_said > BEHIND_REPORT:
            self._behind_said = now
            log.warning(
                "upload to %s is %.0f s behind the training", self.url, now - oldest
            )
        return batch

    def _retry_later(self, batch, exc: BaseException, pause: float) -> None:
        with self._lock:
            queued = {j.config.family.prefix for j in self._queue}
            for prefix, job in batch.items():
                if prefix not in queued:  # a newer save supersedes a failed one
                    self._queue.insert(0, job)
        steps = ", ".join(f"{p} step {j.checkpoint.step}" for p, j in batch.items())
        log.warning(
            "upload to %s failed (%s); %s stay(s) committed in the staging directory, "
            "trying again in %.0f s",
            self.url,
            exc,
            steps,
            pause,
        )

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, FencedError):
            # one story of being fenced off: the heartbeat may have found it first
            with self.lease.held():
                if self.lease.lost is None:
                    self.lease.lost = exc
                exc = self.lease.lost
        if isinstance(exc, CheckpointError):
            say_once(exc, log)
        else:
            log.error("%s", exc)
        with self._lock:
            self._fatal = exc
            self._lock.notify_all()

    def _upload(self, batch: dict[str, _Job], *, delete: bool = True) -> None:
        entries = {p: (j.config, self._send(j.checkpoint)) for p, j in batch.items()}
        chains = {p: branches.chain(j.checkpoint) for p, j in batch.items()}
        self.lease.check()
        self.lease.renew_if_due()
        for prefix, (_, entry) in entries.items():
            resumed = self._resumed.get(prefix)
            if resumed is not None and entry.step >= resumed.step:
                # the checkpoint this run resumed from is protected until one of
                # the same or a later step is committed: this swap commits it (rule 12)
                del self._resumed[prefix]
        doomed: list[str] = []

        def change(head: Head) -> Head:
            doomed.clear()
            for prefix, (config, entry) in entries.items():
                pointer = config.family.pointer
                head = head.with_entry(prefix, entry, publish=None, pointer=pointer)
                head = head.with_entry(
                    prefix, entry, publish=self._chosen(config, head, entry)
                )
                if head.family(prefix).newest() == entry:
                    head = head.with_lineage(prefix, chains[prefix])
                gone = self._retained(config, head, entry)
                doomed.extend(k for e in gone for k in e.keys)
                head = head.without(prefix, [e.key for e in gone])
            return head

        replaced = {
            k
            for prefix, (_, entry) in entries.items()
            for e in self.head.family(prefix).kept
            if e.step == entry.step and e.key != entry.key
            for k in e.keys
        }
        swap = self._swap(change)
        unnamed = swap.unnamed([*doomed, *replaced]) if delete else set()
        for key in sorted(k for k in unnamed if owned(k)):
            try:
                self.storage.delete(key)
            except StorageUnavailableError as exc:
                log.warning(
                    "could not delete %s (%s); the next start's recovery will",
                    self.storage.url_of(key),
                    exc.cause,
                )
        self.uploaded += [entry for _, entry in entries.values()]
        self._spill(entries)

    def _spill(self, entries) -> None:
        """Move the settled older entries of the families just saved into a segment.

        At most one segment per family and save, and only once :data:`~.catalogue.SPILL`
        such entries are in HEAD: HEAD's size stays bounded (rule 48).
        """
        for prefix, (config, _) in entries.items():
            resumed = self._resumed.get(prefix)
            protected = {resumed.name} if resumed is not None else set()
            moving = catalogue.spill_plan(
                self.head.family(prefix), config.policy, protected
            )
            if not moving:
                continue
            segment = catalogue.write_segment(
                self.storage, self.epoch, self.head.seq + 1, prefix, moving
            )
            keys = [e.key for e in moving]
            swap = self._swap(lambda h, p=prefix, g=segment, k=keys: h.spilled(p, g, k))
            if segment not in swap.head.family(prefix).segments:
                self.storage.delete(segment.key)  # nothing names it
                continue
            merging = catalogue.merge_plan(self.head.family(prefix))
            if merging:
                self._merge(prefix, merging)

    def _merge(self, prefix: str, merging) -> None:
        """Name ``merging`` (segments of one level) by one segment of the next."""
        parent = catalogue.write_segment(
            self.storage, self.epoch, self.head.seq + 1, prefix, children=merging
        )
        old = [s.key for s in merging]
        swap = self._swap(lambda h: h.resegmented(prefix, old, [parent]))
        if parent not in swap.head.family(prefix).segments:
            self.storage.delete(parent.key)  # nothing names it

    def _send(self, checkpoint: Checkpoint) -> Entry:
        """Upload one staged checkpoint and its record; return its HEAD entry."""
        record: CommitRecord = checkpoint.record
        name = checkpoint.name
        upload = self._uploads.get(name, 0)
        key = payload_key(self.epoch, name, upload)
        with contextlib.ExitStack() as held:
            try:
                view = held.enter_context(self.staging.map_payload(checkpoint.path))
            except (UnreadableFileError, FileNotFoundError) as exc:
                raise NotSent(
                    f"staged checkpoint {checkpoint.path} is gone ({exc}); "
                    f"it is not uploaded to {self.url}"
                ) from None
            # what is hashed and sent is the page cache's: no read call, no copy
            found = digest_of_view(view, record.algorithm)
            if view.nbytes != record.size or found != record.digest:
                raise NotSent(
                    f"staged checkpoint {checkpoint.path} no longer matches its "
                    "commit record (corrupt, or saved again meanwhile); it is not "
                    f"uploaded to {self.url}"
                )
            self.storage.put(key, view)
        self._uploads[name] = upload + 1
        text = record.to_json().encode("utf-8")
        try:
            self.storage.put_if_absent(record_key(key), text)
        except KeyExistsError:
            existing = self.storage.get(record_key(key))
            if existing is None or existing[0] != text:
                raise CheckpointWriteError(
                    f"could not commit {self.storage.url_of(key)}: another record "
                    "is already there"
                ) from None
        self._send_input(checkpoint)
        return Entry(key, name, record.step, record.size, record.digest, record.metrics)

    def _send_input(self, checkpoint: Checkpoint) -> None:
        """The training input a record names, once per digest: ``inputs/<name>``.

        Content-addressed, outside every epoch's folder: recovery leaves it,
        and no swap of HEAD deletes it (rule 51).
        """
        origin = checkpoint.record.provenance
        digest = origin.input if origin is not None else None
        if digest is None or digest in self._inputs_sent:
            return
        staged = input_path(checkpoint.path.parent, digest)
        try:
            data = self.staging.read_small(staged, MAX_INPUT_BYTES)
        except UnreadableFileError:
            data = None
        if data is not None:
            with contextlib.suppress(KeyExistsError):  # the same content, by name
                self.storage.put_if_absent(f"{INPUTS_DIR}/{staged.name}", data)
        self._inputs_sent.add(digest)

    def send_now(self, config: FamilyConfig, checkpoint: Checkpoint) -> Entry:
        """Upload one committed checkpoint on this thread, deleting nothing; its entry.

        Raises ``NotSent`` when the staged file is gone or no longer
        matches its commit record.
        """
        job = _Job(config, checkpoint, time.monotonic())
        self._upload({config.family.prefix: job}, delete=False)
        return self.uploaded[-1]

    def publish(self, prefix: str, entry: Entry) -> None:
        """Make ``entry``, kept in HEAD, the published checkpoint of ``prefix`` (one swap)."""
        self._swap(lambda head: head.with_entry(prefix, entry, publish=entry.key))

    def _swap(self, change: Callable[[Head], Head]) -> heads.Swap:
        """Move HEAD by ``change`` from what this writer last saw of it."""
        swap = heads.update(
            self.storage, self.epoch, change, known=self._head, format=self.format
        )
        self._head = (swap.head, swap.version)
        return swap

    def sent_url(self, name: str) -> str | None:
        """The URL of the newest upload of the checkpoint file ``name``, or ``None``."""
        sent = [e for e in self.uploaded if e.name == name]
        return self.storage.url_of(sent[-1].key) if sent else None

    def read_input(self, digest: str) -> dict | None:
        """The training input of ``digest`` kept in the remote store, if it is there."""
        try:
            found = kept_input(self.storage, digest)
        except (StorageUnavailableError, CheckpointError):
            return None
        return None if found is None else found[1]

    def _chosen(self, config, head: Head, entry: Entry) -> str:
        """What the family publishes after ``entry``: it, or its best."""
        policy = config.policy
        leader = getattr(policy, "leader", None)
        state = head.family(config.family.prefix)
        if leader is not None:
            best = leader([Candidate(e.name, e.step, e.metrics) for e in state.kept])
            if best is not None:
                return next(e.key for e in state.kept if e.name == best.name)
        published = state.published
        if published is not None and published.step > entry.step:
            return published.key  # never back to an older step
        return entry.key

    def _retained(self, config, head: Head, entry: Entry) -> list[Entry]:
        """The kept entries of the family that retention removes after ``entry``."""
        state = head.family(config.family.prefix)
        resumed = self._resumed.get(config.family.prefix)
        protected = {e.name for e in (entry, state.published, resumed) if e is not None}
        names = plan_prune(
            {e.name: e.step for e in state.kept},
            current_step=entry.step,
            protected=protected,
            policy=config.policy,
            metrics={e.name: e.metrics or {} for e in state.kept},
        )
        return [e for e in state.kept if e.name in set(names)]
