"""The writer lease of a remote store (rule 37), with clocks the test drives."""

from __future__ import annotations

import secrets

import pytest
from helpers import gone_holder

from dp_ckpt_plugin.errors import StoreLockedError
from dp_ckpt_plugin.remote.head import FencedError
from dp_ckpt_plugin.remote.lease import Holder, Lease
from dp_ckpt_plugin.storage.memory import MemoryStorage, forget


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


@pytest.fixture
def mem():
    bucket = f"l{secrets.token_hex(4)}"
    yield MemoryStorage(f"memory://{bucket}/run")
    forget(bucket)


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
