"""Exact resume, piece by piece: random states, data positions, the restart's verdict.

Real torch, real deepmd-kit data systems on the example's tiny data; no ``dp``
process (``tests/test_e2e_exact.py`` runs the whole thing).
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from e2e_support import make_data
from helpers import HAS_TORCH, needs_torch

from dp_ckpt_plugin.deepmd.exact import (
    KEY,
    Continuation,
    ExactResume,
    restart_line,
)

pytestmark = [needs_torch]

TYPE_MAP = ["Cu", "Ag"]


def reload(value):
    """``value`` through ``torch.save`` and ``torch.load(weights_only=True)``."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def draws() -> list:
    """One draw from every generator a training step may use."""
    import torch
    from deepmd.utils import random as dp_random

    return [
        random.random(),
        float(np.random.random()),
        float(np.random.normal()),  # leaves a cached Gaussian behind
        float(dp_random.random()),
        int(dp_random.choice(10)),
        torch.rand(3).tolist(),
    ]


# -- random generators ----------------------------------------------------------


def test_every_generator_is_captured_and_restored():
    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs

    draws()
    state = reload(capture_rngs())  # as deepmd-kit reads a checkpoint
    first = [draws() for _ in range(3)]
    draws()
    restore_rngs(state)
    assert [draws() for _ in range(3)] == first


@pytest.mark.parametrize(
    "kind", ["python", "numpy", "dp_random", "torch"], ids=lambda k: k
)
def test_each_generator_kind_on_its_own(kind):
    """Restoring one kind alone brings that generator back (none is left out)."""
    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs

    index = {"python": [0], "numpy": [1, 2], "dp_random": [3, 4], "torch": [5]}[kind]
    saved = capture_rngs()
    expected = draws()
    draws()
    restore_rngs({**capture_rngs(), kind: saved[kind]})
    got = draws()
    assert [got[i] for i in index] == [expected[i] for i in index]


def test_the_entry_passes_the_torch_format_check():
    from dp_ckpt_plugin.deepmd.exact import capture_rngs
    from dp_ckpt_plugin.formats.torch import check_state

    entry = ExactResume().payload_entry(5, lambda: {"rng": capture_rngs(), "data": []})
    check_state({KEY: entry})
    assert reload(entry)["step"] == 5


def test_a_seed_seeds_dp_random_only_and_ranks_their_own_batches():
    """dp_random (left to chance by dp --pt-expt) is seeded; nothing else moves."""
    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs, seed_rngs

    state = capture_rngs()
    seed_rngs(3)
    first = draws()
    restore_rngs(state)
    seed_rngs(3)
    assert draws() == first
    restore_rngs(state)
    seed_rngs(3, rank=1)
    other = draws()
    # Python's, NumPy's and torch's generators are the process's own
    assert other[0:3] == first[0:3] and other[5] == first[5]
    assert other[3:5] != first[3:5]
    restore_rngs(state)
    untouched = draws()
    assert untouched[0:3] == first[0:3] and untouched[5] == first[5]


def test_no_seed_seeds_nothing():
    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs, seed_rngs

    state = capture_rngs()
    expected = draws()
    restore_rngs(state)
    seed_rngs(None)
    assert draws() == expected


# -- the verdict of a restart -------------------------------------------------------


def entry_of(*ranks, world_size=None):
    entry = {"format": 1, "step": 10}
    if ranks:
        entry["ranks"] = list(ranks)
        entry["world_size"] = world_size or len(ranks)
    return entry


@pytest.mark.parametrize(
    ("exact", "entry", "reason"),
    [
        (
            ExactResume(),
            None,
            "the checkpoint was written by plain deepmd-kit (it holds no random "
            "or data state)",
        ),
        (
            ExactResume(),
            entry_of(),
            "the checkpoint was written with training._dp_ckpt.exact_resume off",
        ),
        (
            ExactResume(enabled=False),
            entry_of({"r": 0}),
            "training._dp_ckpt.exact_resume is off",
        ),
        (
            ExactResume(unsupported="the run reads LMDB data"),
            entry_of({"r": 0}),
            "the run reads LMDB data",
        ),
        (
            ExactResume(world_size=1),
            entry_of({"r": 0}, {"r": 1}),
            "the checkpoint was written by 2 rank(s), this run has 1",
        ),
        (
            ExactResume(rank=1, world_size=2),
            entry_of({"r": 0}),
            "the checkpoint was written by 1 rank(s), this run has 2",
        ),
    ],
    ids=["plain", "off-then", "off-now", "unsupported", "fewer-ranks", "more-ranks"],
)
def test_a_restart_that_is_not_exact_says_why(exact, entry, reason):
    found = exact.continuation(entry)
    assert not found.exact and found.reason == reason
    assert restart_line(10, found) == (
        f"resume at step 10 is not exact: {reason}; the batches from here on "
        "differ from those of an uninterrupted run"
    )


@pytest.mark.parametrize(
    ("exact", "entry", "state"),
    [
        (ExactResume(), entry_of({"r": 0}), {"r": 0}),
        (ExactResume(rank=1, world_size=2), entry_of({"r": 0}, {"r": 1}), {"r": 1}),
        # dp --pt: the chief's state stands for every rank
        (ExactResume(rank=1, world_size=2), entry_of({"r": 0}, world_size=2), {"r": 0}),
    ],
    ids=["one", "each-rank-its-own", "chief-for-all"],
)
def test_an_exact_restart_gives_each_rank_its_state(exact, entry, state):
    found = exact.continuation(entry)
    assert found.exact and found.state == state
    assert restart_line(10, found).startswith("exact resume at step 10: ")


def test_the_entry_gathers_every_rank_and_holds_only_the_step_when_off():
    gathered = ExactResume(world_size=2).payload_entry(
        7, lambda: {"r": 0}, lambda mine: [mine, {"r": 1}]
    )
    assert gathered == entry_of({"r": 0}, {"r": 1}) | {"step": 7}
    off = ExactResume(enabled=False).payload_entry(7, lambda: pytest.fail("captured"))
    assert off == {"format": 1, "step": 7}
    assert Continuation(None, "x").exact is False


# -- data positions -----------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if not HAS_TORCH:
        pytest.skip("torch is not installed")
    return make_data(tmp_path_factory.mktemp("exact_data"), frames=5)


def numpy_system(data_dir):
    from deepmd.utils.data_system import DeepmdDataSystem

    return DeepmdDataSystem(
        systems=[str(data_dir / "train"), str(data_dir / "valid")],
        batch_size=2,
        test_size=1,
        type_map=TYPE_MAP,
        trn_all_set=True,
    )


def numpy_batches(system, count):
    return [system.get_batch()["coord"].tolist() for _ in range(count)]


@pytest.mark.parametrize("consumed", [0, 1, 4, 11])
def test_numpy_data_positions_round_trip(data_dir, consumed):
    """dp --pt-expt's data: the batches after a restore are the ones that follow."""
    import torch

    from dp_ckpt_plugin.deepmd import positions
    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs, seed_rngs

    seed_rngs(11)
    np.random.seed(11)
    torch.manual_seed(11)
    system = numpy_system(data_dir)
    positions.track(system)
    numpy_batches(system, consumed)  # several passes: shuffles compose
    state = reload({"rng": capture_rngs(), "data": positions.capture(system)})
    expected = numpy_batches(system, 12)

    seed_rngs(99)
    fresh = numpy_system(data_dir)
    positions.track(fresh)
    assert positions.restore(fresh, state["data"]) is None
    restore_rngs(state["rng"])
    assert numpy_batches(fresh, 12) == expected


def test_numpy_positions_refuse_other_data(data_dir):
    from deepmd.utils.data_system import DeepmdDataSystem

    from dp_ckpt_plugin.deepmd import positions

    system = numpy_system(data_dir)
    positions.track(system)
    one = DeepmdDataSystem(
        systems=[str(data_dir / "train")],
        batch_size=2,
        test_size=1,
        type_map=TYPE_MAP,
        trn_all_set=True,
    )
    why = positions.restore(one, positions.capture(system))
    assert why == "the data have 1 system(s), the checkpoint's 2"


def pt_data(data_dir):
    """deepmd-kit's ``DpLoaderSet`` of two systems of different sizes (5 and 2 frames)."""
    from deepmd.pt.utils.dataloader import DpLoaderSet

    return DpLoaderSet(
        [str(data_dir / "train"), str(data_dir / "valid")], 2, TYPE_MAP, seed=None
    )


def pt_sampler(data, workers):
    """deepmd-kit's sampler of ``data`` for ``workers`` workers, with ``sys_probs``."""
    from deepmd.pt.utils import env
    from deepmd.pt.utils.dataloader import get_sampler_from_params

    saved = env.NUM_WORKERS
    env.NUM_WORKERS = workers
    try:
        return get_sampler_from_params(data, {"sys_probs": [0.7, 0.3]})
    finally:
        env.NUM_WORKERS = saved


def pt_loader(data_dir, workers=0):
    from dp_ckpt_plugin.deepmd.pt.batches import ResumableLoader

    data = pt_data(data_dir)
    return ResumableLoader(
        data,
        pt_sampler(data, workers),
        num_workers=workers,
        batch_size=None,
        collate_fn=lambda batch: batch,
    )


def deepmd_loader(data_dir, workers):
    """The loader deepmd-kit 3.2's ``dp --pt`` builds (torch's own, with workers)."""
    from torch.utils.data import DataLoader

    data = pt_data(data_dir)
    return DataLoader(
        data,
        sampler=pt_sampler(data, workers),
        batch_size=None,
        num_workers=workers,
        drop_last=False,
        collate_fn=lambda batch: batch,
        pin_memory=False,
    )


def pt_batches(iterator, count):
    return [
        (b["sid"], b["coord"].tolist()) for b in (next(iterator) for _ in range(count))
    ]


def cycle(loader):
    """deepmd-kit's ``cycle_iterator``."""
    import torch

    while True:
        with torch.device("cpu"):
            it = iter(loader)
        yield from it


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_pt_batches_are_deepmds_bit_for_bit(data_dir, workers):
    """The replica draws what torch's loader with ``workers`` worker processes draws.

    Several passes of the outer loader (``sys_probs``, two systems of 5 and 2
    frames in batches of 2: inner passes end and start again), and torch's
    generator left in the same state.
    """
    import torch

    count = 3 * len(pt_sampler(pt_data(data_dir), workers)) + 2
    torch.manual_seed(3)
    expected = pt_batches(cycle(deepmd_loader(data_dir, workers)), count)
    after = torch.get_rng_state()
    torch.manual_seed(3)
    got = pt_batches(cycle(pt_loader(data_dir, workers)), count)
    assert got == expected
    assert torch.equal(torch.get_rng_state(), after)
    assert {sid for sid, _ in got} == {0, 1}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("consumed", [0, 3, 9, 14])
def test_pt_batch_positions_round_trip(data_dir, workers, consumed):
    """dp --pt's batches: restored at a size that does not grow with the step."""
    import torch

    from dp_ckpt_plugin.deepmd.exact import capture_rngs, restore_rngs
    from dp_ckpt_plugin.deepmd.pt import batches

    torch.manual_seed(5)
    loader = pt_loader(data_dir, workers)
    iterator = cycle(loader)  # as deepmd-kit's cycle_iterator
    pt_batches(iterator, consumed)
    state = reload({"rng": capture_rngs(), "data": batches.capture([loader, None])})
    expected = pt_batches(iterator, 20)

    torch.manual_seed(6)
    fresh = pt_loader(data_dir, workers)
    assert batches.restore([fresh, None], state["data"]) is None
    restore_rngs(state["rng"])
    assert pt_batches(cycle(fresh), 20) == expected
    saved = state["data"][0]
    assert len(saved["systems"]) == max(workers, 1)
    assert len(saved["generators"]) == (workers if consumed else 0)
    for lane in saved["systems"]:
        for system in lane:
            assert set(system) == {"started", "seed", "position"}


def test_pt_batch_positions_refuse_other_loaders(data_dir):
    from dp_ckpt_plugin.deepmd.pt import batches

    loader = pt_loader(data_dir)
    saved = batches.capture([loader, None])
    assert batches.restore([loader], saved) == (
        "the data loaders differ from the checkpoint's"
    )
    assert batches.restore([loader, loader], saved) == (
        "the data loaders differ from the checkpoint's"
    )
    assert batches.restore([pt_loader(data_dir, 2), None], saved) == (
        "the checkpoint's data were drawn with NUM_WORKERS=0, this run has 2"
    )
    old = [{"seed": None, "position": 0, "systems": []}, None]
    assert "earlier version of the plugin" in batches.restore([loader, None], old)
