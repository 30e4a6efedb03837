"""Retention by a reported metric, explained, built from plain keys; the ``best`` spec.

``KeepBest`` reads the metrics a trainer passes to ``save``, which the commit
record carries; ``explain_prune`` says what keeps each checkpoint and removes
exactly what ``plan_prune`` removes; ``policy_from_dict`` builds a policy from
the keys a configuration gives; a family ranked by a metric publishes its best
checkpoint, and ``best`` resolves to it.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from helpers import family, make_payload, open_manager

from dp_ckpt_plugin.checkpoint.layout import MANIFEST_NAME, Family
from dp_ckpt_plugin.checkpoint.manifest import read_manifest
from dp_ckpt_plugin.checkpoint.records import check_metrics, read_record, record_path
from dp_ckpt_plugin.errors import InvalidRecordError, RestartNotFoundError
from dp_ckpt_plugin.retention import (
    AnyOf,
    Candidate,
    KeepAll,
    KeepBest,
    KeepEveryNSteps,
    KeepLast,
    explain_prune,
    plan_prune,
    policy_from_dict,
    policy_to_dict,
)
from dp_ckpt_plugin.store.core import CheckpointStore, FamilyConfig

# -- KeepBest ------------------------------------------------------------------


def candidates(values):
    """Candidates m-<step>.h5 with metric ``loss`` (None: not reported)."""
    return [
        Candidate(f"m-{s}.h5", s, None if v is None else {"loss": v})
        for s, v in values.items()
    ]


def test_keep_best_keeps_the_lowest_and_ignores_missing_and_non_finite():
    found = candidates({1: 0.5, 2: None, 3: 0.1, 4: math.nan, 5: 0.3, 6: 0.9})
    assert KeepBest(2, "loss").keeps(found, frozenset()) == {"m-3.h5", "m-5.h5"}
    assert KeepBest(2, "loss", "max").keeps(found, frozenset()) == {
        "m-6.h5",
        "m-1.h5",
    }
    assert KeepBest(9, "loss").keeps(found, frozenset()) == {
        "m-1.h5",
        "m-3.h5",
        "m-5.h5",
        "m-6.h5",
    }
    assert KeepBest(1, "other").keeps(found, frozenset()) == set()


def test_keep_best_ties_go_to_the_newer_step():
    found = candidates({1: 0.2, 2: 0.2, 3: 0.2})
    assert [c.step for c in KeepBest(3, "loss").rank(found)] == [3, 2, 1]


@pytest.mark.parametrize(
    ("args", "match"),
    [((0, "loss"), "count"), ((True, "loss"), "count"), ((1, ""), "metric")],
)
def test_keep_best_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        KeepBest(*args)
    with pytest.raises(ValueError, match="mode"):
        KeepBest(1, "loss", "lowest")


def test_candidates_still_unpack_as_name_and_step():
    c = Candidate("m-3.h5", 3, {"loss": 1.0})
    name, step = c
    assert (name, step) == ("m-3.h5", 3) == (c.name, c.step)
    assert c == ("m-3.h5", 3)
    assert Candidate("m-1.h5", 1).metrics == {}


# -- explaining ------------------------------------------------------------------


def test_each_policy_names_itself_and_says_why():
    assert (KeepLast(5).name, KeepLast(5).reason) == ("keep_last", "newest 5")
    assert KeepLast(0).reason == "all kept"
    assert KeepAll().reason == "all kept"
    assert KeepEveryNSteps(1000).reason == "every 1000 steps"
    assert KeepBest(3, "rmse_val").reason == "best 3 by rmse_val (lowest)"
    both = AnyOf((KeepLast(2), KeepEveryNSteps(10)))
    assert (both.name, both.reason) == ("any_of", "newest 2 or every 10 steps")


def test_explain_says_which_policy_keeps_each_file():
    committed = {f"m-{s}.h5": s for s in (10, 20, 25, 30, 35, 40)}
    metrics = {"m-10.h5": {"loss": 0.1}, "m-25.h5": {"loss": 0.5}}
    policy = AnyOf((KeepLast(2), KeepEveryNSteps(20), KeepBest(1, "loss")))
    verdicts = explain_prune(
        committed,
        current_step=35,
        protected={"m-35.h5": "just written"},
        policy=policy,
        metrics=metrics,
    )
    by = {v.name: v for v in verdicts}
    assert [v.name for v in verdicts] == sorted(committed, key=committed.get)
    # protected files occupy slots of the window without being the window's
    assert by["m-35.h5"].kept_by == (("protected", "just written"),)
    assert by["m-30.h5"].kept_by == (("keep_last", "newest 2"),)
    assert by["m-20.h5"].kept_by == (("keep_every_n_steps", "every 20 steps"),)
    assert by["m-10.h5"].kept_by == (("keep_best", "best 1 by loss (lowest)"),)
    assert not by["m-25.h5"].kept
    # numbered above the current step: left alone (an earlier run's are archived)
    assert by["m-40.h5"].kept_by == (
        ("above_current_step", "numbered above the current step 35"),
    )
    assert {v.name for v in verdicts if not v.kept} == set(
        plan_prune(
            committed,
            current_step=35,
            protected={"m-35.h5"},
            policy=policy,
            metrics=metrics,
        )
    )


def test_a_policy_without_name_or_explain_is_explained_by_its_class():
    class KeepOdd:
        def keeps(self, candidates, protected):
            return {n for n, s in candidates if s % 2}

    verdicts = explain_prune(
        {"m-1.h5": 1, "m-2.h5": 2}, current_step=2, protected=(), policy=KeepOdd()
    )
    assert verdicts[0].kept_by[0][0] == "KeepOdd"
    assert not verdicts[1].kept


CASES = [random.Random(1000 + seed) for seed in range(300)]


@pytest.mark.parametrize("rng", CASES, ids=lambda r: "")
def test_explain_removes_exactly_what_plan_prune_removes(rng):
    steps = rng.sample(range(30), rng.randint(0, 12))
    committed = {f"m-{s}.h5": s for s in steps}
    metrics = {
        n: {"loss": rng.choice([rng.random(), math.nan])}
        for n in committed
        if rng.random() < 0.7
    }
    current = rng.randint(0, 30)
    protected = set(
        rng.sample(sorted(committed), min(len(committed), rng.randint(0, 3)))
    )
    parts = [KeepLast(rng.randint(-1, 6))]
    if rng.random() < 0.5:
        parts.append(KeepEveryNSteps(rng.choice([2, 5])))
    if rng.random() < 0.6:
        parts.append(KeepBest(rng.randint(1, 3), "loss", rng.choice(["min", "max"])))
    policy = parts[0] if len(parts) == 1 else AnyOf(tuple(parts))
    args = {"current_step": current, "policy": policy, "metrics": metrics}
    doomed = plan_prune(committed, protected=protected, **args)
    verdicts = explain_prune(committed, protected=protected, **args)
    assert sorted(v.name for v in verdicts) == sorted(committed)
    assert {v.name for v in verdicts if not v.kept} == set(doomed)
    for v in verdicts:
        assert (("protected", "protected") in v.kept_by) == (v.name in protected)
    # the best ones carrying the metric are kept, whatever else is
    best = next((p for p in parts if isinstance(p, KeepBest)), None)
    if best is not None:
        eligible = [
            (n, s) for n, s in committed.items() if s <= current or n in protected
        ]
        for name in best.keeps(
            [Candidate(n, s, metrics.get(n)) for n, s in eligible], frozenset()
        ):
            assert name not in doomed


# -- plain keys --------------------------------------------------------------------


def test_policy_from_dict_composes_window_milestones_and_best():
    policy = policy_from_dict(
        {
            "keep_last": 5,
            "keep_every_n_steps": 1000,
            "keep_best": 3,
            "best_metric": "rmse_val",
        }
    )
    assert policy == AnyOf(
        (KeepLast(5), KeepEveryNSteps(1000), KeepBest(3, "rmse_val", "min"))
    )
    assert policy_from_dict({}) == KeepLast(5)
    assert policy_from_dict({"keep_last": 2, "keep_best": 0}) == KeepLast(2)
    assert policy_from_dict(
        {"keep_last": None, "keep_best": 1, "best_metric": "e:mae"}
    ) == KeepBest(1, "e:mae")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"max_ckpt_kep": 5}, "unknown retention key 'max_ckpt_kep'"),
        ({"keep_last": "5"}, "'keep_last' must be an integer"),
        ({"keep_last": True}, "'keep_last' must be an integer"),
        ({"keep_best": 2}, "'keep_best' needs 'best_metric'"),
        ({"keep_last": None}, "would keep nothing"),
        ({"keep_every_n_steps": -3}, "n >= 1"),
        ({"keep_best": 1, "best_metric": "x", "best_mode": "up"}, "mode"),
        ([("keep_last", 5)], "mapping"),
    ],
)
def test_policy_from_dict_names_the_bad_key(spec, match):
    with pytest.raises(ValueError, match=match):
        policy_from_dict(spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"keep_last": 3},
        {"keep_last": 0},
        {"keep_last": None, "keep_every_n_steps": 7},
        {"keep_last": 2, "keep_best": 2, "best_metric": "m", "best_mode": "max"},
        {
            "keep_last": 4,
            "keep_every_n_steps": 10,
            "keep_best": 1,
            "best_metric": "loss",
            "best_mode": "min",
        },
    ],
)
def test_policy_to_dict_round_trips(spec):
    policy = policy_from_dict(spec)
    assert policy_from_dict(policy_to_dict(policy)) == policy


def test_policy_to_dict_says_none_when_the_keys_cannot_say_it():
    class Custom:
        def keeps(self, candidates, protected):
            return set()

    assert policy_to_dict(Custom()) is None
    assert policy_to_dict(AnyOf((KeepLast(1), KeepLast(2)))) is None
    assert policy_to_dict(AnyOf((KeepLast(1), Custom()))) is None


# -- metrics in records -----------------------------------------------------------


def test_metrics_are_checked_before_anything_is_written(tmp_path):
    assert check_metrics({"loss": 1, "nan": math.nan}) == {"loss": 1.0, "nan": None}
    assert check_metrics({}) is None
    for bad in ({"loss": True}, {"loss": "low"}, {"": 1.0}, {1: 1.0}, [1.0]):
        with pytest.raises(TypeError):
            check_metrics(bad)
    m = open_manager(tmp_path / "models")
    try:
        with pytest.raises(TypeError, match="'loss' must be a number"):
            m.save(1, make_payload(1), metrics={"loss": "low"})
    finally:
        m.close()
    assert not list(tmp_path.rglob("*model.ckpt*"))


def test_metrics_travel_in_the_commit_record(tmp_path):
    m = open_manager(tmp_path / "models")
    try:
        path = m.save(3, make_payload(3), metrics={"loss": 0.25, "lr": math.inf})
        plain = m.save(4, make_payload(4))
    finally:
        m.close()
    assert read_record(path).metrics == {"loss": 0.25, "lr": None}
    assert json.loads(record_path(path).read_text())["metrics"] == {
        "loss": 0.25,
        "lr": None,
    }
    assert read_record(plain).metrics is None
    assert "metrics" not in json.loads(record_path(plain).read_text())


@pytest.mark.parametrize(
    "bad", [[1.0], {"loss": "x"}, {"loss": True}, {"": 1.0}, {"loss": {"a": 1}}]
)
def test_malformed_metrics_mean_not_committed(tmp_path, bad):
    m = open_manager(tmp_path / "models")
    try:
        path = m.save(1, make_payload(1), metrics={"loss": 1.0})
    finally:
        m.close()
    data = json.loads(record_path(path).read_text())
    data["metrics"] = bad
    record_path(path).write_text(json.dumps(data))
    with pytest.raises(InvalidRecordError, match="metrics"):
        read_record(path)


# -- a store kept by a metric ------------------------------------------------------

LOSSES = {1: 0.9, 2: 0.2, 3: 0.5, 4: 0.1, 5: 0.7, 6: 0.3}


def save_losses(directory, policy, losses=LOSSES, **kwargs):
    m = open_manager(directory, policy=policy, **kwargs)
    try:
        for step, loss in losses.items():
            m.save(step, make_payload(step), metrics={"loss": loss})
    finally:
        m.close()
    return m


def names_in(directory):
    return sorted(p.name for p in directory.glob("model.ckpt-*.h5"))


def test_keep_best_prunes_by_the_recorded_metric(tmp_path):
    save_losses(
        tmp_path / "models",
        {"keep_last": 1, "keep_best": 2, "best_metric": "loss"},
    )
    # the newest (6) by the window, the best two (4: 0.1, 2: 0.2) by the metric
    assert names_in(tmp_path / "models") == [
        "model.ckpt-2.h5",
        "model.ckpt-4.h5",
        "model.ckpt-6.h5",
    ]


def test_a_ranked_family_publishes_its_best_and_describes_itself(tmp_path):
    d = tmp_path / "models"
    save_losses(d, {"keep_last": None, "keep_best": 2, "best_metric": "loss"})
    # the best two, and the one just written (protected until the next save)
    assert names_in(d) == ["model.ckpt-2.h5", "model.ckpt-4.h5", "model.ckpt-6.h5"]
    assert (d / "checkpoint").read_text().strip() == "model.ckpt-4.h5"
    assert (d / "model.ckpt.h5").resolve() == d / "model.ckpt-4.h5"
    manifest = read_manifest(d)
    assert manifest.format == "hdf5"
    (info,) = manifest.families
    assert info.family.prefix == "model.ckpt" and info.family.suffix == ".h5"
    assert info.policy == {
        "keep_last": None,
        "keep_best": 2,
        "best_metric": "loss",
        "best_mode": "min",
    }
    assert info.reason == "best 2 by loss (lowest)"
    assert json.loads((d / MANIFEST_NAME).read_text())["format_version"] == 1


def test_an_unranked_family_publishes_the_newest(tmp_path):
    d = tmp_path / "models"
    save_losses(d, {"keep_last": 2})
    assert (d / "checkpoint").read_text().strip() == "model.ckpt-6.h5"
    assert read_manifest(d).families[0].policy == {"keep_last": 2}


def test_best_resolves_to_the_best_committed_checkpoint(tmp_path):
    d = tmp_path / "models"
    save_losses(d, {"keep_last": 3, "keep_best": 1, "best_metric": "loss"})
    m = open_manager(
        d,
        policy={"keep_last": 3, "keep_best": 1, "best_metric": "loss"},
        verify="digest",
    )
    try:
        assert m.resolve("latest") == d / "model.ckpt-6.h5"
        found = m.store.resolve("best", digest=True)
        assert found.path == d / "model.ckpt-4.h5"
        assert found.checked == "digest"
        assert found.how == f"best 1 by loss (lowest) in {d}"
        assert m.resolve(f"best:{d}") == d / "model.ckpt-4.h5"
        assert m.restore("best").step == 4
    finally:
        m.close()


def test_a_corrupt_best_is_moved_aside_and_the_next_best_used(tmp_path, caplog):
    d = tmp_path / "models"
    policy = {"keep_last": None, "keep_best": 3, "best_metric": "loss"}
    save_losses(d, policy)
    best = d / "model.ckpt-4.h5"
    with open(best, "r+b") as handle:
        handle.truncate(10)
    m = open_manager(d, policy=policy)
    try:
        found = m.store.resolve("best")
    finally:
        m.close()
    assert found.path == d / "model.ckpt-2.h5"
    assert not best.exists()
    assert any(
        p.name.startswith("model.ckpt-4.h5") for p in (d / "quarantine").iterdir()
    )
    assert any("model.ckpt-4.h5" in w for w in found.warnings)


def test_best_without_a_ranked_family_says_why(tmp_path):
    d = tmp_path / "models"
    save_losses(d, {"keep_last": 2})
    m = open_manager(d)
    try:
        with pytest.raises(RestartNotFoundError, match="no family kept by a metric"):
            m.resolve("best")
        with pytest.raises(RestartNotFoundError, match="no family kept by a metric"):
            m.resolve(f"best:{tmp_path}")
    finally:
        m.close()


def test_best_when_no_checkpoint_carries_the_metric(tmp_path):
    d = tmp_path / "models"
    m = open_manager(d, policy={"keep_best": 1, "best_metric": "loss"})
    try:
        m.save(1, make_payload(1))
        with pytest.raises(RestartNotFoundError, match="carries the metric 'loss'"):
            m.resolve("best")
    finally:
        m.close()


def test_a_family_added_late_keeps_the_run_resumed_from_it(tmp_path, pm):
    """``--restart best``: the host adds the best family after resolving."""
    d = tmp_path / "models"
    periodic = FamilyConfig(family(), KeepLast(0))
    best = FamilyConfig(
        Family("best.ckpt", ".h5", "checkpoint.best.ckpt"), KeepBest(2, "loss")
    )
    with CheckpointStore(d, format="hdf5", pm=pm, families=[periodic, best]) as first:
        for step, loss in LOSSES.items():
            first.save(step, make_payload(step))
            first.save(
                step, make_payload(step), family="best.ckpt", metrics={"loss": loss}
            )
    assert (d / "checkpoint.best.ckpt").read_text().strip() == "best.ckpt-4.h5"
    with CheckpointStore(d, format="hdf5", pm=pm, families=[periodic]) as second:
        found = second.resolve("best")
        assert found.path == d / "best.ckpt-4.h5"
        second.add_family(best)  # the trainer learns of it after the preflight
        second.save(5, make_payload(5))
    # continuing from step 4: what lay above it went to the archive, the
    # checkpoint resumed from and everything up to it stayed
    assert names_in(d) == [f"model.ckpt-{s}.h5" for s in (1, 2, 3, 4, 5)]
    assert sorted(p.name for p in d.glob("best.ckpt-*.h5")) == [
        "best.ckpt-2.h5",
        "best.ckpt-4.h5",
    ]
    (archived,) = (d / "archive").iterdir()
    assert sorted(p.name for p in archived.glob("*-*.h5")) == [
        "best.ckpt-6.h5",
        "model.ckpt-5.h5",
        "model.ckpt-6.h5",
    ]


# -- the deepmd-kit host's keys ----------------------------------------------------


def test_the_host_section_is_checked_strictly():
    from dp_ckpt_plugin.deepmd.argcheck import plugin_options
    from dp_ckpt_plugin.errors import ConfigError

    options = plugin_options(
        {"training": {"_dp_ckpt": {"retention": {"keep_best": 2}}}}
    )
    assert options.retention == {
        "keep_every_n_steps": None,
        "keep_best": 2,
        "best_metric": "rmse_val",
        "best_mode": "min",
    }
    for bad, where in [
        ({"keep_bst": 2}, "training/_dp_ckpt/retention/keep_bst"),
        ({"keep_best": -1}, "training/_dp_ckpt/retention/keep_best"),
        (
            {"keep_every_n_steps": "often"},
            "training/_dp_ckpt/retention/keep_every_n_steps",
        ),
        ({"best_mode": "up"}, "training/_dp_ckpt/retention/best_mode"),
    ]:
        with pytest.raises(ConfigError, match=f"invalid input at `{where}`"):
            plugin_options({"training": {"_dp_ckpt": {"retention": bad}}})


def test_the_host_builds_window_milestones_and_best():
    from dp_ckpt_plugin.deepmd.retention_args import best_policy, periodic_policy

    training = {"max_ckpt_keep": 3, "ema_ckpt_keep": 1}
    retention = {"keep_every_n_steps": 100, "keep_best": 2, "best_metric": "rmse_val"}
    assert periodic_policy(training, retention) == AnyOf(
        (KeepLast(3), KeepEveryNSteps(100), KeepBest(2, "rmse_val"))
    )
    # EMA checkpoints record no metric of their own: window and milestones
    assert periodic_policy(training, retention, ema=True) == AnyOf(
        (KeepLast(1), KeepEveryNSteps(100))
    )
    assert periodic_policy(training, None) == KeepLast(3)
    assert periodic_policy(training, {"keep_every_n_steps": 0}) == KeepLast(3)
    ratio = {"ckpt_keep_ratio": 0.5, "save_freq": 10}
    assert periodic_policy(ratio, None, num_steps=100) == KeepLast(5)
    assert best_policy(2, "e:mae") == KeepBest(2, "e:mae", "min")


def test_the_host_names_metrics_as_lcurve_does():
    from dp_ckpt_plugin.deepmd.retention_args import display_metrics

    train = {"rmse": 1.0, "rmse_e": 0.1}
    assert display_metrics(train, {"rmse": 2.0}) == {
        "rmse_trn": 1.0,
        "rmse_e_trn": 0.1,
        "rmse_val": 2.0,
    }
    assert display_metrics(train, None) == {"rmse_trn": 1.0, "rmse_e_trn": 0.1}
    tasks = {"water": {"rmse": 1.0}, "metal": {"rmse": 3.0}}
    assert display_metrics(tasks, {"water": {"rmse": 2.0}, "metal": None}) == {
        "rmse_trn_water": 1.0,
        "rmse_trn_metal": 3.0,
        "rmse_val_water": 2.0,
    }


def test_plugin_specifications_reach_the_resolvers_as_given(tmp_path):
    from dp_ckpt_plugin.deepmd.settings import normalized_spec

    (tmp_path / "models").mkdir()
    for spec in ("best", "best:models", "best:../elsewhere/models", "step:200"):
        assert normalized_spec(spec, tmp_path) == spec
    assert normalized_spec("models", tmp_path) == str(tmp_path / "models")
    assert normalized_spec("run/../models", tmp_path) == str(tmp_path / "models")
    assert normalized_spec("model.ckpt", tmp_path) == str(tmp_path / "model.ckpt")
    (tmp_path / "best").mkdir()  # a directory of that name is a directory
    assert normalized_spec("best", tmp_path) == str(tmp_path / "best")


def test_the_key_of_0_2_is_refused_in_one_line_naming_keep_last():
    for spec in (
        {"max_ckpt_keep": 2, "keep_best": 0},
        {"max_ckpt_keep": 2, "keep_last": 2},
    ):
        with pytest.raises(ValueError) as caught:
            policy_from_dict(spec)
        assert str(caught.value) == (
            "retention key 'max_ckpt_keep' is 'keep_last' since 0.3"
        )


def test_the_manager_argument_of_0_1_is_refused_in_one_line_naming_format(tmp_path):
    from dp_ckpt_plugin import CheckpointManager

    with pytest.raises(TypeError) as caught:
        CheckpointManager(tmp_path / "models", backend="hdf5", lock=False)
    assert str(caught.value) == "CheckpointManager(backend=) is format= since 0.3"
    assert not (tmp_path / "models").exists()


def test_verify_sha256_is_refused_in_one_line_naming_digest(tmp_path):
    from dp_ckpt_plugin import CheckpointManager

    with pytest.raises(ValueError) as caught:
        CheckpointManager(tmp_path / "models", verify="sha256", lock=False)
    assert str(caught.value) == "verify='sha256' is verify='digest' since 0.3"
