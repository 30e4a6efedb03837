"""Rules 11, 12 and 14 as pure policy: which committed checkpoints go."""

from __future__ import annotations

import pytest

from dp_ckpt_plugin.deepmd.policy import keep_count_from_ratio, policy_from_training
from dp_ckpt_plugin.retention import (
    KeepAll,
    KeepLast,
    plan_prune,
)


def names(steps):
    return {f"m-{s}.h5": s for s in steps}


def test_window_keeps_newest():
    doomed = plan_prune(
        names([1, 2, 3, 4]), current_step=4, protected={"m-4.h5"}, policy=KeepLast(2)
    )
    assert doomed == ["m-1.h5", "m-2.h5"]


@pytest.mark.parametrize("count", [0, -1])
def test_values_below_one_keep_everything(count):
    assert (
        plan_prune(
            names(range(10)),
            current_step=9,
            protected={"m-9.h5"},
            policy=KeepLast(count),
        )
        == []
    )
    assert KeepLast(count).window is None


def test_keep_all():
    assert (
        plan_prune(names(range(10)), current_step=9, protected=set(), policy=KeepAll())
        == []
    )


def test_protected_files_occupy_slots_of_the_window():
    # window 2; the just-written (5) and the resumed-from (1) are protected:
    # the family keeps exactly max(2, 2) = 2 files, not window + 1.
    doomed = plan_prune(
        names([1, 2, 3, 4, 5]),
        current_step=5,
        protected={"m-5.h5", "m-1.h5"},
        policy=KeepLast(2),
    )
    assert sorted(doomed) == ["m-2.h5", "m-3.h5", "m-4.h5"]


def test_more_protected_than_window_keeps_all_protected():
    doomed = plan_prune(
        names([1, 2, 3, 4, 5]),
        current_step=5,
        protected={"m-5.h5", "m-1.h5", "m-3.h5"},
        policy=KeepLast(1),
    )
    assert sorted(doomed) == ["m-2.h5", "m-4.h5"]


def test_checkpoints_above_the_current_step_are_never_the_windows():
    # rule 14: steps above the current one are not removed by retention (an
    # earlier run's are archived before the first save), nor counted
    doomed = plan_prune(
        names([2, 3, 4, 6, 7, 8, 9]),
        current_step=4,
        protected={"m-4.h5"},
        policy=KeepLast(2),
    )
    assert doomed == ["m-2.h5"]
    doomed = plan_prune(
        names([1, 2, 3, 4, 9]), current_step=4, protected={"m-4.h5"}, policy=KeepLast(0)
    )
    assert doomed == []


def test_protected_remnant_is_kept():
    doomed = plan_prune(
        names([4, 9]),
        current_step=4,
        protected={"m-4.h5", "m-9.h5"},
        policy=KeepLast(1),
    )
    assert doomed == []


def test_ratio_matches_deepmd_kit():
    ckpt = pytest.importorskip("deepmd.dpmodel.train.checkpoint")
    for ratio, steps, freq in [
        (0.5, 100, 10),
        (0.1, 95, 10),
        (1.0, 20, 5),
        (0.01, 10, 0),
        (0.3, 7, 100),
    ]:
        assert keep_count_from_ratio(
            ratio, steps, freq
        ) == ckpt.resolve_keep_ckpt_count(ratio, steps, freq)


def test_policy_from_training_keys():
    assert policy_from_training({}) == KeepLast(5)
    assert policy_from_training({"max_ckpt_keep": 2}) == KeepLast(2)
    assert policy_from_training(
        {"max_ckpt_keep": 2, "ema_ckpt_keep": 7}, ema=True
    ) == KeepLast(7)
    assert policy_from_training({"max_ckpt_keep": 2}, ema=True) == KeepLast(2)
    ratio = {
        "ckpt_keep_ratio": 0.5,
        "save_freq": 10,
        "max_ckpt_keep": 99,
        "ema_ckpt_keep": 1,
    }
    assert policy_from_training(ratio, num_steps=100) == KeepLast(5)
    assert policy_from_training(ratio, num_steps=100, ema=True) == KeepLast(5)
