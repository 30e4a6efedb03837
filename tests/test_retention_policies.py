"""Retention policies against a plain oracle, over generated families (rules 11, 12)."""

from __future__ import annotations

import random

import pytest
from helpers import committed_steps, make_payload, open_manager

from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.retention import (
    AnyOf,
    Candidate,
    KeepAll,
    KeepBest,
    KeepEveryNSteps,
    KeepLast,
    RetentionPolicy,
    as_policy,
    plan_prune,
)
from dp_ckpt_plugin.store.family import FamilyConfig


def oracle(committed, current, protected, window, every=None):
    """The rules written out plainly: what a family keeps after a save."""
    above = {n for n, s in committed.items() if s > current and n not in protected}
    rest = sorted((s, n) for n, s in committed.items() if n not in above)
    kept = {n for _, n in rest if n in protected}
    others = [n for _, n in rest if n not in protected]
    if window is None or window < 1:
        kept |= set(others)
    else:
        free = max(0, window - len(kept))
        kept |= set(list(reversed(others))[:free])
    if every:
        kept |= {n for s, n in rest if s % every == 0}
    return {n for _, n in rest if n not in kept}


CASES = [random.Random(seed) for seed in range(400)]


@pytest.mark.parametrize("rng", CASES, ids=lambda r: "")
def test_plan_prune_matches_the_oracle(rng):
    steps = rng.sample(range(30), rng.randint(0, 12))
    committed = {f"m-{s}.h5": s for s in steps}
    current = rng.randint(0, 30)
    protected = set(
        rng.sample(sorted(committed), min(len(committed), rng.randint(0, 4)))
    )
    window = rng.randint(-1, 8)
    every = rng.choice([None, 2, 5])
    policy: RetentionPolicy = KeepLast(window)
    if every:
        policy = AnyOf((policy, KeepEveryNSteps(every)))
    doomed = plan_prune(
        committed, current_step=current, protected=protected, policy=policy
    )
    assert set(doomed) == oracle(committed, current, protected, window, every)
    assert len(doomed) == len(set(doomed))
    assert not set(doomed) & protected
    # oldest first; never a step above the current one (rule 14)
    assert doomed == sorted(doomed, key=committed.get)
    assert all(committed[n] <= current for n in doomed)
    if not every and window >= 1:
        window_part = {
            n for n, s in committed.items() if s <= current or n in protected
        }
        left = len(window_part - set(doomed))
        assert left <= max(window, len(protected & set(committed)))


def test_window_larger_than_the_family_keeps_everything():
    committed = {f"m-{s}.h5": s for s in (1, 2, 3)}
    assert (
        plan_prune(committed, current_step=3, protected={"m-3.h5"}, policy=KeepLast(5))
        == []
    )


def test_policies_are_small_objects_the_planner_does_not_know():
    class KeepOdd:
        def keeps(self, candidates, protected):
            return {n for n, s in candidates if s % 2}

    committed = {f"m-{s}.h5": s for s in range(6)}
    adapted = as_policy(KeepOdd())
    assert isinstance(adapted, RetentionPolicy)
    assert (adapted.keeps_all(3), adapted.ranked, adapted.leader([])) == (
        False,
        False,
        None,
    )
    assert adapted.name == "KeepOdd"
    doomed = plan_prune(
        committed,
        current_step=5,
        protected={"m-5.h5"},
        policy=AnyOf((KeepOdd(), KeepLast(1))),
    )
    assert doomed == ["m-0.h5", "m-2.h5", "m-4.h5"]
    assert (
        plan_prune(committed, current_step=5, protected=set(), policy=KeepAll()) == []
    )
    with pytest.raises(ValueError):
        KeepEveryNSteps(0)


def test_the_protocol_declares_what_a_policy_can_say():
    """``keeps_all``, ``ranked`` and ``leader`` are the protocol's, not found by name."""
    for policy in (KeepAll(), KeepLast(3), KeepEveryNSteps(2), AnyOf((KeepLast(1),))):
        assert isinstance(policy, RetentionPolicy)
        assert not policy.ranked
    assert KeepAll().keeps_all(10**6) and KeepLast(3).keeps_all(3)
    assert not KeepLast(3).keeps_all(4) and not KeepEveryNSteps(2).keeps_all(1)
    best = KeepBest(1, "loss")
    assert best.ranked
    assert (
        best.leader(
            [Candidate("a", 1, {"loss": 2.0}), Candidate("b", 2, {"loss": 1.0})]
        ).name
        == "b"
    )
    assert as_policy(best) is best
    with pytest.raises(TypeError, match="keeps"):
        as_policy(object())


class KeepEven:
    """A policy with ``keeps`` alone, as a user writes one."""

    def keeps(self, candidates, protected):
        return {n for n, s in candidates if s % 2 == 0}


def test_a_family_adapts_a_policy_with_keeps_alone(tmp_path):
    """A store prunes with such a policy, set at construction or later."""
    config = FamilyConfig(Family("m", ".h5"), KeepEven())
    assert isinstance(config.policy, RetentionPolicy)
    config.policy = KeepLast(1)
    config.policy = KeepEven()
    assert isinstance(config.policy, RetentionPolicy)
    with open_manager(tmp_path / "models", policy=KeepEven()) as m:
        for step in range(1, 6):
            m.save(step, make_payload(step))
    assert committed_steps(tmp_path / "models") == [2, 4, 5]
