"""The conformance suite every backend passes."""

from __future__ import annotations

import os
import pickle

import pytest
from helpers import BACKENDS, SUFFIX, assert_same, nested_payload, temporaries

from dp_ckpt_plugin.checkpoint.digests import digest_of
from dp_ckpt_plugin.checkpoint.records import read_record


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each built-in format; ``torch`` skips where torch is not installed."""
    return request.param


def test_round_trip_is_exact(make_manager, backend):
    m = make_manager(format=backend)
    state = nested_payload(3, backend)
    path = m.save(3, state)
    assert path.suffix == SUFFIX[backend]
    restored = m.restore("latest")
    assert restored.step == 3 and restored.path == path
    assert_same(state, restored.state)


def test_every_save_is_committed_and_leaves_no_temporary(make_manager, backend):
    m = make_manager(format=backend, max_keep=2)
    for step in range(4):
        path = m.save(step, nested_payload(step, backend))
        record = read_record(path)
        assert record.format == backend and record.digest == digest_of(path)
    names = os.listdir(m.directory)
    assert temporaries(m.directory) == []
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
        m.save(step, nested_payload(step, backend))
    sfx = SUFFIX[backend]
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
    m.save(1, nested_payload(1, backend))
    expected = (
        TypeError
        if backend == "hdf5"
        else (pickle.PicklingError, AttributeError, TypeError)
    )
    with pytest.raises(expected):
        m.save(2, {"bad": object()} if backend == "hdf5" else {"bad": lambda: 0})
    names = os.listdir(m.directory)
    assert temporaries(m.directory) == []
    assert f"model.ckpt-2{SUFFIX[backend]}" not in names
    assert m.restore("latest").step == 1
