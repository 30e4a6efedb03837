"""Loading a recorded optimizer state under ``training.zero_stage`` (both backends).

deepmd-kit 3.2 records the optimizer state in two forms: keyed by the
parameters' positions (a single process, DDP, ZeRO-1: ``optimizer.state_dict()``)
or by their names (FSDP2, ``zero_stage`` 2 and 3:
``get_optimizer_state_dict(full_state_dict=True)``). Its
``Trainer._load_optimizer_state`` hands the recorded form to this run's
loader as it is, which fails in three ways, in both backends and in plain
deepmd-kit alike:

- a stage 2/3 restart of a model whose descriptor has the compression
  placeholders (``compress_info.*``, ``compress_data.*``: zero-size
  parameters that require a gradient and never get one, so Adam keeps no
  state for them) is refused by torch's strict load ("Missing optimizer state
  for parameter ..."), before any step;
- a stage 0/1 checkpoint restarted at stage 2/3 loads the positions as
  foreign keys, trains, and crashes at the first save (``KeyError: '0'``),
  losing the steps since the restart;
- a stage 2/3 checkpoint restarted at stage 0/1 fails at once (ZeRO-1
  indexes a list with the names).

:func:`load_optimizer_state` is what the hosts' trainers put in place of
``_load_optimizer_state``: it re-keys the recorded state to the form this
stage loads (the order of the parameters is the optimizer's own, their names
those of the unwrapped model, which are FSDP2's), and under FSDP2 loads
non-strictly only when every trainable parameter without recorded state has
no elements (those keep a fresh, empty state). The checkpoint is not
changed: what a save writes stays deepmd-kit's payload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CheckpointError


def parameter_order(optimizer, module) -> list[str]:
    """The names of ``optimizer``'s parameters, in the order it numbers them.

    ``module`` is the unwrapped model (its names are those FSDP2 records).

    Raises
    ------
    CheckpointError
        When the optimizer holds a parameter the model does not name.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    order = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in names:
                raise CheckpointError(
                    "cannot load the checkpoint's optimizer state: the optimizer "
                    "holds a parameter the model does not name"
                )
            order.append(names[id(param)])
    return order


def rekeyed(
    state: Mapping[str, Any], order: Sequence[str], *, by_name: bool
) -> Mapping[str, Any]:
    """``state`` keyed by names (``by_name``) or positions, as this stage loads it.

    ``order`` is :func:`parameter_order`: position ``i`` is ``order[i]``. A
    state already in the wanted form is returned as it is.

    Raises
    ------
    CheckpointError
        When the recorded parameters are not this model's (another count,
        other names): one sentence, before anything is loaded.
    """
    groups = state.get("param_groups") or []
    recorded = [key for group in groups for key in group.get("params", [])]
    if not recorded:
        return state
    named = all(isinstance(key, str) for key in recorded)
    if named == by_name:
        return state
    if named:
        index = {name: i for i, name in enumerate(order)}
        if sorted(recorded) != sorted(order):
            missing = sorted(set(order) - set(recorded))[:1]
            extra = sorted(set(recorded) - set(order))[:1]
            what = (
                f"it has no state for parameter {missing[0]}"
                if missing
                else f"it holds parameter {extra[0]}, which the model does not have"
            )
            raise CheckpointError(
                f"the checkpoint's optimizer state does not fit this model: {what}"
            )
        convert: Callable[[Any], Any] = index.__getitem__
    else:
        if len(recorded) != len(order) or set(recorded) != set(range(len(order))):
            raise CheckpointError(
                "the checkpoint's optimizer state does not fit this model: it "
                f"records {len(recorded)} parameter(s), the model has {len(order)}"
            )
        convert = order.__getitem__
    return {
        **state,
        "state": {convert(key): value for key, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [convert(key) for key in group["params"]]}
            for group in groups
        ],
    }


def stateless_parameters(state: Mapping[str, Any], module) -> list[str]:
    """Trainable parameters of ``module`` the name-keyed ``state`` has no state for.

    Raises
    ------
    CheckpointError
        When one of them has elements: its optimizer state was lost, and a
        fresh one would change the run.
    """
    recorded = state.get("state") or {}
    missing = []
    for name, param in module.named_parameters():
        if not param.requires_grad or name in recorded:
            continue
        if math.prod(param.shape) > 0:
            raise CheckpointError(
                f"the checkpoint has no optimizer state for trainable parameter "
                f"{name} (shape {tuple(param.shape)}); it cannot be resumed exactly"
            )
        missing.append(name)
    return missing


def load_optimizer_state(
    trainer, state: Mapping[str, Any], *, module, load: Callable[[Any], None]
) -> None:
    """Load ``state`` into ``trainer.optimizer`` as this stage needs it.

    ``module`` is the unwrapped model; ``load`` is deepmd-kit's own
    ``_load_optimizer_state``, used for every stage that does not shard the
    parameters (with the state re-keyed by position).
    """
    by_name = bool(trainer.sharding.shards_parameters)
    state = rekeyed(state, parameter_order(trainer.optimizer, module), by_name=by_name)
    if not by_name:
        load(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    # zero-size placeholders never get a gradient, so Adam kept no state for
    # them; torch's strict load refuses that (deepmd-kit 3.2's bug)
    strict = not stateless_parameters(state, module)
    set_optimizer_state_dict(
        trainer.wrapper,
        trainer.optimizer,
        optim_state_dict=state,
        options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=strict
        ),
    )
