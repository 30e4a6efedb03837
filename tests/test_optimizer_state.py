"""Re-keying a recorded optimizer state across ``training.zero_stage`` forms.

deepmd-kit 3.2 records it by position (one process, DDP, ZeRO-1) or by name
(FSDP2, stages 2 and 3) and loads it as recorded, which fails across forms
and, under FSDP2, for the zero-size compression placeholders that never get
optimizer state (``deepmd/optimizer_state.py``). The real two-rank runs are in
``test_e2e_sharded.py``.
"""

from __future__ import annotations

import types

import pytest
from helpers import needs_torch

from dp_ckpt_plugin.deepmd.optimizer_state import (
    load_optimizer_state,
    parameter_order,
    rekeyed,
    stateless_parameters,
)
from dp_ckpt_plugin.errors import CheckpointError

pytestmark = needs_torch


def model_and_optimizer():
    """A model with a zero-size trainable placeholder that gets no gradient."""
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 3)
            self.placeholder = torch.nn.Parameter(torch.zeros(0))
            self.b = torch.nn.Linear(3, 1)

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    return model, optimizer


def by_name(model, optimizer):
    return rekeyed(
        optimizer.state_dict(), parameter_order(optimizer, model), by_name=True
    )


def test_positions_become_names_and_back():
    model, optimizer = model_and_optimizer()
    order = parameter_order(optimizer, model)
    assert order == ["placeholder", "a.weight", "a.bias", "b.weight", "b.bias"]
    positions = optimizer.state_dict()
    names = rekeyed(positions, order, by_name=True)
    assert names["param_groups"][0]["params"] == order
    assert sorted(names["state"]) == sorted(set(order) - {"placeholder"})
    assert names["param_groups"][0]["lr"] == 0.1  # the rest of a group is kept
    back = rekeyed(names, order, by_name=False)
    assert back["param_groups"][0]["params"] == [0, 1, 2, 3, 4]
    assert sorted(back["state"]) == [1, 2, 3, 4]
    # each form loads into a fresh optimizer of the same model, unchanged
    _, fresh = model_and_optimizer()
    fresh.load_state_dict(back)
    assert float(fresh.state_dict()["state"][3]["step"]) == 1.0


@pytest.mark.parametrize("wanted", [True, False])
def test_a_state_in_the_wanted_form_is_left_as_it_is(wanted):
    model, optimizer = model_and_optimizer()
    state = by_name(model, optimizer) if wanted else optimizer.state_dict()
    assert rekeyed(state, parameter_order(optimizer, model), by_name=wanted) is state
    empty = {"state": {}, "param_groups": []}
    assert rekeyed(empty, [], by_name=True) is empty


def test_a_state_of_another_model_is_refused_in_one_sentence():
    model, optimizer = model_and_optimizer()
    order = parameter_order(optimizer, model)
    names = by_name(model, optimizer)
    with pytest.raises(CheckpointError, match=r"no state for parameter c\.weight"):
        rekeyed(names, [*order, "c.weight"], by_name=False)
    with pytest.raises(CheckpointError, match=r"holds parameter a\.bias, which"):
        rekeyed(names, [n for n in order if n != "a.bias"], by_name=False)
    with pytest.raises(CheckpointError, match=r"records 5 parameter.*the model has 4"):
        rekeyed(optimizer.state_dict(), order[:4], by_name=True)


def test_only_zero_size_parameters_may_lack_state():
    model, optimizer = model_and_optimizer()
    names = by_name(model, optimizer)
    assert stateless_parameters(names, model) == ["placeholder"]
    del names["state"]["a.bias"]
    with pytest.raises(
        CheckpointError, match=r"trainable parameter a.bias \(shape \(3,\)\)"
    ):
        stateless_parameters(names, model)


def test_unsharded_stages_load_through_deepmds_loader_by_position():
    model, optimizer = model_and_optimizer()
    names = by_name(model, optimizer)
    fresh_model, fresh = model_and_optimizer()
    trainer = types.SimpleNamespace(
        optimizer=fresh, sharding=types.SimpleNamespace(shards_parameters=False)
    )
    loaded = []
    load_optimizer_state(trainer, names, module=fresh_model, load=loaded.append)
    ((state,),) = [loaded]
    assert state["param_groups"][0]["params"] == [0, 1, 2, 3, 4]


def test_an_optimizer_holding_a_parameter_the_model_does_not_name_is_refused():
    import torch

    model, _ = model_and_optimizer()
    stranger = torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
    with pytest.raises(CheckpointError, match="does not name"):
        parameter_order(stranger, model)
