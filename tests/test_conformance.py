"""The conformance suite every backend passes."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from dp_ckpt_plugin.layout import is_temp
from dp_ckpt_plugin.records import read_record, sha256_of

BACKENDS = ["hdf5", "torch"]


def state_for(backend, step):
    rng = np.random.default_rng(step)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i64": np.arange(step, step + 4, dtype=np.int64),
        "empty": np.zeros((0, 2)),
    }
    if backend == "torch":
        import torch

        return {
            "model": {k: torch.from_numpy(v.copy()) for k, v in arrays.items()},
            "optimizer": {
                "state": {},
                "param_groups": [{"lr": 0.001, "params": [0, 1]}],
            },
            "train_infos": {"step": step, "lr": 1e-3},
        }
    return {
        "model": arrays,
        "train_infos": {"step": step, "lr": 1e-3, "note": "hi", "flags": [True, None]},
    }


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif hasattr(a, "dtype") and hasattr(a, "shape"):
        assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
        assert type(a) is type(b) and a == b


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "torch":
        pytest.importorskip("torch")
    return request.param


def test_round_trip_is_exact(make_manager, backend):
    m = make_manager(format=backend)
    state = state_for(backend, 3)
    path = m.save(3, state)
    assert path.suffix == (".h5" if backend == "hdf5" else ".pt")
    restored = m.restore("latest")
    assert restored.step == 3 and restored.path == path
    assert_same(state, restored.state)


def test_every_save_is_committed_and_leaves_no_temporary(make_manager, backend):
    m = make_manager(format=backend, max_keep=2)
    for step in range(4):
        path = m.save(step, state_for(backend, step))
        record = read_record(path)
        assert record.format == backend and record.sha256 == sha256_of(path)
    names = os.listdir(m.directory)
    assert not [n for n in names if is_temp(n)]
    assert sorted(n for n in names if not n.startswith(".")) == sorted(
        [
            "checkpoint",
            f"model.ckpt{path.suffix}",
            f"model.ckpt-2{path.suffix}",
            f"model.ckpt-3{path.suffix}",
        ]
    )


def test_resolution_forms(make_manager, backend, tmp_path):
    m = make_manager(format=backend, max_keep=0)
    for step in (1, 2):
        m.save(step, state_for(backend, step))
    sfx = ".h5" if backend == "hdf5" else ".pt"
    d = m.directory
    for spec in [
        "latest",
        str(d),
        str(d / f"model.ckpt-2{sfx}"),
        str(d / "model.ckpt"),
    ]:
        assert m.resolve(spec) == d / f"model.ckpt-2{sfx}", spec
    assert m.restore(str(d / f"model.ckpt-1{sfx}")).step == 1


def test_unserializable_payload_fails_cleanly(make_manager, backend):
    m = make_manager(format=backend)
    m.save(1, state_for(backend, 1))
    expected = (
        TypeError
        if backend == "hdf5"
        else (pickle.PicklingError, AttributeError, TypeError)
    )
    with pytest.raises(expected):
        m.save(2, {"bad": object()} if backend == "hdf5" else {"bad": lambda: 0})
    names = os.listdir(m.directory)
    assert not [n for n in names if is_temp(n)]
    assert f"model.ckpt-2{'.h5' if backend == 'hdf5' else '.pt'}" not in names
    assert m.restore("latest").step == 1
