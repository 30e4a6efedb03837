"""The writer lease of a remote store (rule 37), with clocks the test drives."""

from __future__ import annotations

import pytest
from helpers import gone_holder

from dp_ckpt_plugin.errors import StoreLockedError
from dp_ckpt_plugin.remote.head import FencedError
from dp_ckpt_plugin.remote.lease import Holder, Lease


class Clock:
    """A monotonic clock, a wall clock and a sleep that only move when told."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.wall = 1_800_000_000.0
        self.slept = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds
        self.slept += seconds


def lease(storage, clock, holder=None, ttl=60.0):
    return Lease(
        storage,
        ttl=ttl,
        holder=holder or Holder("otherhost", 4242, "dp train", "then"),
        clock=lambda: clock.now,
        wall=lambda: clock.wall,
        sleep=clock.sleep,
    )


def test_the_first_take_is_epoch_one_and_a_release_frees_it_at_once(mem):
    clock = Clock()
    first = lease(mem, clock)
    assert first.acquire() == 1
    first.release()
    second = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    assert second.acquire() == 2 and clock.slept == 0


def test_a_live_holder_refuses_at_once_naming_it(mem):
    clock = Clock()
    lease(mem, clock).acquire()
    other = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    with pytest.raises(StoreLockedError, match="pid 4242 on otherhost") as caught:
        other.acquire()
    assert "\n" not in str(caught.value) and clock.slept == 0


def test_a_holder_of_this_host_that_is_gone_is_taken_over_at_once(mem):
    clock = Clock()
    lease(mem, clock, gone_holder()).acquire()
    mine = lease(mem, clock, Holder.this_process())
    assert mine.acquire() == 2 and clock.slept == 0
    assert "is gone" in mine.notes[0]


def test_a_holder_that_stopped_renewing_is_waited_for_then_taken_over(mem):
    clock = Clock()
    lease(mem, clock, ttl=60).acquire()
    clock.sleep(45)  # more than two renewal periods went by without a renewal
    clock.slept = 0
    other = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    assert other.acquire() == 2
    assert 60 <= clock.slept < 70  # its time to live, on this host's clock
    assert "not renewed" in other.notes[0]


def test_a_holder_that_renews_while_waited_for_refuses(mem):
    clock = Clock()
    holder = lease(mem, clock, ttl=60)
    holder.acquire()
    clock.sleep(45)
    other = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    renewed = {"done": False}
    original = clock.sleep

    def sleep(seconds):
        original(seconds)
        if not renewed["done"]:
            holder.renew()
            renewed["done"] = True

    other._sleep = sleep
    with pytest.raises(StoreLockedError):
        other.acquire()


def test_a_lease_taken_over_fences_its_old_holder(mem):
    clock = Clock()
    old = lease(mem, clock, ttl=10)
    old.acquire()
    clock.sleep(100)  # long gone by the wall clock
    new = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"), ttl=10)
    assert new.acquire() == 2
    with pytest.raises(FencedError, match="another run took the store over"):
        old.renew()
    with pytest.raises(FencedError):
        old.check()


def test_the_epoch_is_above_what_head_carries(mem):
    clock = Clock()
    assert lease(mem, clock).acquire(min_epoch=7) == 7


# -- judged by its version on this host's clock, never by the time it carries ------


def _planted(storage, renewed, ttl=60.0, host="otherhost"):
    """A lease of another host's run, renewed at ``renewed`` by its own clock."""
    from dp_ckpt_plugin.remote.keys import LEASE_KEY
    from dp_ckpt_plugin.remote.lease import LeaseState

    holder = Holder(host, 4242, "dp", "then")
    storage.put(LEASE_KEY, LeaseState(5, holder, renewed, ttl).to_bytes())


#: Times a lease may carry, as offsets from this host's wall clock.
CARRIED = {
    "far past": -1e9,
    "long ago": -3600.0,
    "two periods ago": -45.0,
    "a moment ago": -1.0,
    "a little ahead": 3.0,
    "ahead": 30.0,
    "far ahead": 1e9,
    "the largest time": None,  # the bound of the format
}


@pytest.mark.parametrize("carried", CARRIED)
def test_a_gone_holder_is_taken_after_its_ttl_whatever_time_it_carries(mem, carried):
    clock = Clock()
    offset = CARRIED[carried]
    renewed = 99_999_999_999.0 if offset is None else max(0.0, clock.wall + offset)
    _planted(mem, renewed)
    other = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    fresh = offset is not None and -1.0 <= offset <= 3.0
    if fresh:  # says it was renewed a moment ago: refused at once, taken later
        with pytest.raises(StoreLockedError):
            other.acquire()
        assert clock.slept == 0
        clock.sleep(60)
        clock.slept = 0
    assert other.acquire() == 6
    # never sooner than its time to live on this host's clock, never much later
    assert 60 <= clock.slept < 62
    assert "not renewed for 60 s" in other.notes[0]


@pytest.mark.parametrize("carried", ["far past", "far ahead", "a moment ago"])
def test_a_live_holder_is_never_taken_whatever_time_it_carries(mem, carried):
    """A holder whose clock is far off renews: its version moves, so it is kept."""
    clock = Clock()
    offset = CARRIED[carried]
    skewed = Clock()
    skewed.wall = max(0.0, clock.wall + offset)
    holder = lease(mem, skewed, ttl=60)
    holder.acquire()
    other = lease(mem, clock, Holder("thirdhost", 1, "dp train", "now"))
    original = clock.sleep

    def sleep(seconds):
        original(seconds)
        skewed.sleep(seconds)
        holder.renew_if_due()

    other._sleep = sleep
    with pytest.raises(StoreLockedError, match="pid 4242 on otherhost"):
        other.acquire()
    assert clock.slept <= 60 / 3 + 1  # refused by its next renewal at the latest
    holder.check()  # and the holder still holds it


def test_release_lease_frees_a_gone_holder_with_a_time_far_ahead(mem):
    clock = Clock()
    _planted(mem, 99_999_999_999.0)
    freer = lease(mem, clock, Holder("adminhost", 7, "dp-ckpt", "now"))
    why = freer.clear()
    assert why == "it was not renewed for 60 s" and 60 <= clock.slept < 62
    state, _ = freer.read()
    assert state.released and state.epoch == 5
    assert freer.clear() == "it was released already"
    # the next run takes it at once, above its epoch
    clock.slept = 0
    assert lease(mem, clock, Holder("h", 2, "dp", "now")).acquire() == 6
    assert clock.slept == 0


def test_release_lease_refuses_a_holder_that_renews(mem):
    clock = Clock()
    holder = lease(mem, clock, ttl=60)
    holder.acquire()
    clock.sleep(50)  # looks stale by its time, but it is alive
    freer = lease(mem, clock, Holder("adminhost", 7, "dp-ckpt", "now"))
    original = clock.sleep

    def sleep(seconds):
        original(seconds)
        holder.renew_if_due()

    freer._sleep = sleep
    with pytest.raises(StoreLockedError):
        freer.clear()
    holder.check()
    assert not freer.read()[0].released


def test_release_lease_removes_a_malformed_lease_and_says_when_there_is_none(mem):
    from dp_ckpt_plugin.remote.keys import LEASE_KEY

    clock = Clock()
    mem.put(LEASE_KEY, b"{not json")
    assert "malformed" in lease(mem, clock).clear()
    assert mem.head(LEASE_KEY) is None
    assert lease(mem, clock).clear() is None


def test_the_command_releases_a_gone_holder_with_a_time_far_ahead(mem, capsys):
    """``dp-ckpt prune U --release-lease`` on the real clock (a short lease)."""
    from dp_ckpt_plugin.commands import main

    _planted(mem, 99_999_999_999.0, ttl=0.5)
    assert main(["prune", mem.url, "--release-lease"]) == 0
    out = capsys.readouterr().out
    assert out == f"{mem.url}: lease released (it was not renewed for 0.5 s)\n"
    assert Lease(mem).read()[0].released
