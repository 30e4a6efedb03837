"""The heads of a multi-task checkpoint (``model_dict``), for ``dp freeze``.

deepmd-kit freezes one head of a multi-task checkpoint, named by ``--head``;
without it, pt_expt ends with a traceback and pt with a bare ``assert``.
:func:`check_head` says so first, in one line naming the heads, reading the
checkpoint's ``model_params`` from the bytes the front door verified (the
ones deepmd-kit's freeze then loads).
"""

from __future__ import annotations

from typing import Any, BinaryIO

from ..errors import CheckpointError
from ..storage import PayloadBytes
from .logs import shown


def heads_of(file: BinaryIO) -> list[str] | None:
    """The heads of the checkpoint in ``file``; ``None`` for a single-task one
    (or one whose model parameters cannot be read here: deepmd-kit says why)."""
    import torch

    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:  # not a zip checkpoint, or not one of deepmd-kit's
        return None
    params = _get(state, "model", "_extra_state", "model_params")
    model_dict = params.get("model_dict") if isinstance(params, dict) else None
    return list(model_dict) if isinstance(model_dict, dict) else None


def check_head(payload: PayloadBytes, head: str | None, *, command: str) -> None:
    """Refuse to freeze a multi-task checkpoint (its verified bytes) without a head it has.

    Raises
    ------
    CheckpointError
        Naming the heads, when ``head`` is missing or not one of them.
    """
    path = payload.path
    heads = heads_of(payload.reader())
    if heads is None:
        return
    names = ", ".join(heads)
    if head is None:
        raise CheckpointError(
            f"{shown(path)} is a multi-task checkpoint with the heads {names}: say which "
            f"to freeze with --head (such as {command} --head {heads[0]})"
        )
    if head not in heads:
        raise CheckpointError(
            f"--head {head}: {shown(path)} has no such head; its heads are {names}"
        )


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
