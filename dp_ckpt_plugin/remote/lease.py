"""The writer lease of a remote store: one writer at a time, fenced by epoch.

``U/LEASE`` is a small JSON object: the epoch, the holder (host, pid, program
name, since; never the program's arguments, which may hold a secret), when it
was last renewed and for how long it holds. It moves only by
``put_if_absent`` (the first writer ever) and ``put_if_match`` (every renewal,
takeover and release), so of two runs starting at once exactly one takes it,
and the other is refused with one line naming the holder.

Each take bumps the epoch. HEAD carries the epoch of the writer that moved it
(:mod:`.head`), so a writer that lost its lease (paused, cut off from the
network while its lease ran out and another run took over) is refused at its
next renewal or its next move of HEAD, whichever comes first, and deletes
nothing.

A lease is free when its holder released it, when its holder ran on this host
and its process is gone, or when its version (the object's ETag) stayed the
same for its whole time to live counted on this host's own clock: a live
holder renews it every third of that time, so a version unchanged that long
means the holder is gone. The time a lease carries is never trusted to free
it (clocks disagree between hosts, and a lease may carry any time): it only
decides whether a run is refused at once (renewed within the last renewal
period by this host's clock) or watches the version first. A time in the
future is watched like any other, so no lease blocks ``U`` for good, and
:meth:`Lease.clear` (``dp-ckpt prune --release-lease``) frees one whose
holder is gone the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from ..checkpoint.limits import (
    MAX_EPOCH,
    MAX_HOLDER_COMMAND,
    MAX_HOLDER_HOST,
    MAX_HOLDER_SINCE,
    MAX_INT,
    MAX_LEASE_BYTES,
    MAX_LEASE_SECONDS,
    check_int,
    check_size,
    check_time,
    is_int,
    is_time,
)
from ..checkpoint.records import load_json
from ..errors import CheckpointWriteError, InvalidRecordError, StoreLockedError
from ..storage.objects import (
    KeyExistsError,
    ObjectStorage,
    StorageUnavailableError,
    VersionMismatchError,
)
from ..text import shown
from .head import FencedError, say_once, took_over
from .keys import LEASE_KEY

log = logging.getLogger("dp_ckpt_plugin")

#: Seconds a lease holds without renewal, unless told otherwise.
DEFAULT_TTL = 60.0
#: A live holder renews this often, as a fraction of its time to live.
RENEW_FRACTION = 1 / 3
#: Seconds a holder's clock may run ahead of this host's and its lease still
#: count as renewed a moment ago.
CLOCK_SLACK = 5.0


@dataclass(frozen=True)
class Holder:
    """Who holds a lease."""

    host: str
    pid: int
    command: str
    since: str

    @classmethod
    def this_process(cls) -> Holder:
        """This process: its host, pid and program name (never its arguments,
        which may hold a secret, and the lease is stored in the bucket)."""
        return cls(
            socket.gethostname()[:MAX_HOLDER_HOST],
            os.getpid(),
            program_name()[:MAX_HOLDER_COMMAND],
            time.strftime("%Y-%m-%dT%H:%M:%S%z")[:MAX_HOLDER_SINCE],
        )

    def describe(self) -> str:
        """Who holds it, in one line fit to show (its text came from ``U``)."""
        return (
            f"pid {self.pid} on {shown(self.host, 80)}, since {shown(self.since, 40)}: "
            f"{shown(self.command, 120)}"
        )


_HOLDER_TEXT = {
    "host": MAX_HOLDER_HOST,
    "command": MAX_HOLDER_COMMAND,
    "since": MAX_HOLDER_SINCE,
}


@dataclass(frozen=True)
class LeaseState:
    """What ``U/LEASE`` says."""

    epoch: int
    holder: Holder
    renewed: float
    ttl: float
    released: bool = False

    def to_bytes(self) -> bytes:
        """The JSON text LEASE is stored as.

        Raises
        ------
        ValueError
            When a field is beyond what readers accept
            (``checkpoint/limits.py``).
        """
        check_int(self.epoch, "a lease's epoch", MAX_EPOCH, low=1)
        check_int(self.holder.pid, "a lease holder's pid")
        for key, longest in _HOLDER_TEXT.items():
            value = getattr(self.holder, key)
            if type(value) is not str or len(value) > longest:
                raise ValueError(
                    f"a lease holder's {key} must be a string of at most "
                    f"{longest} characters"
                )
        check_time(self.renewed, "a lease's renewal time")
        if not 0 < self.ttl < MAX_LEASE_SECONDS:
            raise ValueError(
                f"a lease holds above 0 and below {MAX_LEASE_SECONDS:.0f} s, "
                f"got {self.ttl!r}"
            )
        data = {"what": "dp_ckpt_plugin writer lease", **asdict(self)}
        text = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
        return check_size(text, "LEASE", MAX_LEASE_BYTES)

    @classmethod
    def parse(cls, data: bytes, source: str) -> LeaseState:
        try:
            raw = load_json(data.decode("utf-8"), source, "lease")
        except UnicodeDecodeError:
            raise InvalidRecordError(f"lease {source} is not UTF-8 text") from None
        who = raw.get("holder") if type(raw) is dict else None
        try:
            epoch, renewed, ttl = raw["epoch"], raw["renewed"], raw["ttl"]
            released = raw.get("released", False)
            texts = {k: str(who[k])[:most] for k, most in _HOLDER_TEXT.items()}
            holder = Holder(pid=who["pid"], **texts)
        except (KeyError, TypeError):
            raise InvalidRecordError(
                f"lease {source} is malformed; if no run writes this store, "
                "remove it (dp-ckpt prune --release-lease)"
            ) from None
        if not (
            is_int(epoch, MAX_EPOCH, low=1)
            and is_int(holder.pid, MAX_INT)
            and is_time(renewed)
            and type(ttl) in (int, float)
            and 0 < ttl < MAX_LEASE_SECONDS
            and type(released) is bool
        ):
            raise InvalidRecordError(
                f"lease {source} holds a value out of range; if no run writes this "
                "store, remove it (dp-ckpt prune --release-lease)"
            )
        return cls(epoch, holder, float(renewed), float(ttl), released)


def program_name() -> str:
    """The name of this process's program (``dp``, ``dp-ckpt``, ``pytest``)."""
    first = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name = os.path.basename(first)
    if name == "__main__.py":  # python -m PACKAGE: the package's name
        name = os.path.basename(os.path.dirname(first))
    if not name or name == "-c":
        name = os.path.basename(sys.executable or "") or "python"
    return name[:64]


def alive(pid: int) -> bool:
    """Whether a process of this host with ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass
    return True


class Lease:
    """This run's hold on a remote store (see the module docs).

    Parameters
    ----------
    storage : dp_ckpt_plugin.storage.objects.ObjectStorage
        The store's storage.
    ttl : float
        Seconds the lease holds without renewal.
    clock, wall, sleep : callable
        The monotonic clock, the wall clock and sleep (tests drive time).
    """

    def __init__(
        self,
        storage: ObjectStorage,
        *,
        ttl: float = DEFAULT_TTL,
        holder: Holder | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.storage = storage
        self.ttl = float(ttl)
        self.holder = holder or Holder.this_process()
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self.epoch: int | None = None
        self.version: str | None = None
        self._renewed_at = 0.0  # monotonic start of the last successful renewal
        self._taken_at = 0.0  # monotonic start of the request that took it
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Why this lease was lost, once it was.
        self.lost: FencedError | None = None
        #: What the last acquisition said (a takeover, a wait), for the log.
        self.notes: list[str] = []

    @property
    def url(self) -> str:
        return self.storage.url_of(LEASE_KEY)

    # -- reading ---------------------------------------------------------------
    def read(self) -> tuple[LeaseState | None, str | None]:
        """The lease as it is now, and its version."""
        found = self.storage.get(LEASE_KEY, MAX_LEASE_BYTES)
        if found is None:
            return None, None
        data, info = found
        return LeaseState.parse(data, self.url), info.version

    def _free(self, state: LeaseState) -> str | None:
        """Why ``state`` may be taken at once, or ``None`` if it may not."""
        if state.released:
            return "released"
        if state.holder.host == self.holder.host and not alive(state.holder.pid):
            return f"its holder, pid {state.holder.pid} on this host, is gone"
        return None

    def _fresh(self, state: LeaseState) -> bool:
        """Whether ``state`` says it was renewed within the last renewal period.

        Only ever a reason to refuse at once, never to take: a time ahead of
        this host's clock (beyond :data:`CLOCK_SLACK`) is not fresh.
        """
        age = self._wall() - state.renewed
        return -CLOCK_SLACK <= age < 2 * state.ttl * RENEW_FRACTION

    def _watch(
        self, state: LeaseState, version: str | None, watched: tuple | None
    ) -> tuple[tuple | None, str | None]:
        """One look at a held lease: ``(watched, why)``; ``why`` once it is free.

        ``watched`` is ``(version, since)``: the version first seen and when,
        on this host's monotonic clock.

        Raises
        ------
        StoreLockedError
            When its holder is alive: it was renewed a moment ago, or its
            version changed while watched.
        """
        if watched is None or watched[0] != version:
            if watched is not None or self._fresh(state):
                raise self._refusal(state)
            watched = (version, self._clock())
            log.warning(
                "%s: waiting up to %.0f s for the lease of %s to be renewed "
                "(it seems to have stopped)",
                self.storage.url,
                state.ttl,
                state.holder.describe(),
            )
        if self._clock() - watched[1] < state.ttl:
            self._sleep(min(1.0, state.ttl / 10))
            return watched, None
        return watched, f"it was not renewed for {state.ttl:g} s"

    # -- taking ------------------------------------------------------------------
    def acquire(self, *, min_epoch: int = 1) -> int:
        """Take the lease; return this run's epoch (at least ``min_epoch``).

        Raises
        ------
        StoreLockedError
            Naming the holder, when another run holds it.
        """
        with self._lock:
            if self.epoch is not None:
                return self.epoch
            for state, version, why in self._until_free():
                epoch = min_epoch if state is None else max(state.epoch + 1, min_epoch)
                if self._take(version, epoch, why, state):
                    return self.epoch

    def _until_free(self) -> Iterator[tuple[LeaseState | None, str | None, str]]:
        """``(state, version, why)`` each time the lease is free to move (``state``
        ``None``: there is none); watched as long as it is held. Whoever failed
        to move it asks again."""
        watched: tuple[str, float] | None = None  # (version, since) being waited on
        while True:
            state, version = self.read()
            why = "created" if state is None else self._free(state)
            if why is None:
                watched, why = self._watch(state, version, watched)
                if why is None:
                    continue
            yield state, version, why
            watched = None

    def _take(
        self, version: str | None, epoch: int, why: str, previous: LeaseState | None
    ) -> bool:
        try:
            data = self._state(epoch).to_bytes()
        except ValueError as exc:
            raise CheckpointWriteError(f"{self.url}: {exc}") from None
        started = self._clock()
        try:
            if version is None:
                info = self.storage.put_if_absent(LEASE_KEY, data)
            else:
                info = self.storage.put_if_match(LEASE_KEY, data, version)
        except (KeyExistsError, VersionMismatchError):
            return False  # another run moved it first: look again
        self.epoch, self.version, self._renewed_at = epoch, info.version, started
        self._taken_at = started
        if previous is not None and why != "released":
            self.notes.append(
                f"took over {self.storage.url} from {previous.holder.describe()} "
                f"(epoch {previous.epoch} -> {epoch}): {why}"
            )
        return True

    def _refusal(self, state: LeaseState) -> StoreLockedError:
        return StoreLockedError(
            f"checkpoint store {self.storage.url} is in use by another run "
            f"({state.holder.describe()}, epoch {state.epoch}; it renews its lease "
            f"every {state.ttl * RENEW_FRACTION:.0f} s); wait for it to finish or "
            "choose another save_dir"
        )

    def clear(self) -> str | None:
        """Release a lease whose holder is gone; return why it was free.

        ``None`` when there is no lease. A lease that is not free at once
        (released, or its holder ran on this host and is gone) is watched up to its time to live on this host's
        clock; it is released (by compare-and-swap, keeping its epoch) only if
        its version did not change meanwhile. A malformed lease is removed.

        Raises
        ------
        StoreLockedError
            When its holder renews it.
        """
        try:
            for state, version, why in self._until_free():
                if state is None:
                    return None
                if state.released:
                    return "it was released already"
                mine = replace(state, holder=self.holder, renewed=self._wall())
                released = replace(mine, released=True)
                # VersionMismatchError: it moved as it was released: look again
                with contextlib.suppress(VersionMismatchError):
                    self.storage.put_if_match(LEASE_KEY, released.to_bytes(), version)
                    return why
        except InvalidRecordError:
            self.storage.delete(LEASE_KEY)
            return "it was malformed, so it was removed"

    def _state(self, epoch: int, *, released: bool = False) -> LeaseState:
        """This run's lease of ``epoch``, renewed now."""
        return LeaseState(epoch, self.holder, self._wall(), self.ttl, released)

    # -- holding -----------------------------------------------------------------
    def held(self) -> threading.RLock:
        """The lock under which :attr:`lost` changes (for a caller that sets it)."""
        return self._lock

    def held_for(self) -> float:
        """Seconds since the request that took the lease began (this host's clock)."""
        return self._clock() - self._taken_at

    def check(self) -> None:
        """Raise :class:`~dp_ckpt_plugin.remote.head.FencedError` if this lease was lost."""
        if self.lost is not None:
            raise self.lost

    def valid_for(self) -> float:
        """Seconds this lease surely holds, on this host's clock."""
        if self.epoch is None:
            return 0.0
        return self._renewed_at + self.ttl - self._clock()

    def renew_if_due(self) -> bool:
        """Renew when a third of the time to live passed; return whether it renewed."""
        with self._lock:
            self.check()
            if self.valid_for() > self.ttl * (1 - RENEW_FRACTION):
                return False
            self.renew()
            return True

    def renew(self) -> None:
        """Renew now (compare-and-swap on this lease's version)."""
        with self._lock:
            self.check()
            if self.epoch is None:
                raise FencedError(self.storage.url, "this run holds no lease")
            data = self._state(self.epoch).to_bytes()
            started = self._clock()
            try:
                info = self.storage.put_if_match(LEASE_KEY, data, self.version)
            except VersionMismatchError:
                now, version = self.read()
                mine = (self.epoch, self.holder)
                if now is not None and (now.epoch, now.holder) == mine:
                    # our own renewal, whose answer was lost: it holds
                    self.version, self._renewed_at = version, started
                    return
                detail = (
                    took_over(self.epoch, now.epoch, now.holder.describe())
                    if now is not None
                    else "its lease was removed by someone else"
                )
                self.lost = FencedError(self.storage.url, detail)
                raise self.lost from None
            self.version, self._renewed_at = info.version, started

    def start_heartbeat(self) -> None:
        """Renew in a thread of its own while the run trains between saves."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, name="dp_ckpt-lease", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        period = self.ttl * RENEW_FRACTION
        while not self._stop.wait(period / 2):
            try:
                self.renew_if_due()
            except FencedError:
                say_once(self.lost, log)
                return
            except StorageUnavailableError as exc:
                if self.valid_for() <= 0:
                    self.lost = FencedError(
                        self.storage.url,
                        f"the lease could not be renewed for {self.ttl:.0f} s "
                        f"({exc.cause}), so another run may take the store over",
                    )
                    say_once(self.lost, log)
                    return

    def release(self) -> None:
        """Give the lease up, so the next run takes it at once (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            if self.epoch is None or self.lost is not None:
                return
            data = self._state(self.epoch, released=True).to_bytes()
            with contextlib.suppress(VersionMismatchError, StorageUnavailableError):
                self.storage.put_if_match(LEASE_KEY, data, self.version)
            self.epoch = None
