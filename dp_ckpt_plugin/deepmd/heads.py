"""The heads of a multi-task checkpoint (``model_dict``), for ``dp freeze``.

deepmd-kit freezes one head of a multi-task checkpoint, named by ``--head``;
without it, pt_expt ends with a traceback and pt with a bare ``assert``.
:func:`check_head` says so first, in one line naming the heads, reading only
the checkpoint's ``model_params`` (the file is memory-mapped: its tensors are
not read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .logs import shown


def heads_of(path: Path) -> list[str] | None:
    """The heads of the checkpoint at ``path``; ``None`` for a single-task one
    (or one whose model parameters cannot be read here: deepmd-kit says why)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a zip checkpoint, or not one of deepmd-kit's
        return None
    params = _get(state, "model", "_extra_state", "model_params")
    model_dict = params.get("model_dict") if isinstance(params, dict) else None
    return list(model_dict) if isinstance(model_dict, dict) else None


def check_head(path: Path, head: str | None, *, command: str) -> None:
    """Refuse to freeze a multi-task checkpoint without a head it has.

    Raises
    ------
    CheckpointError
        Naming the heads, when ``head`` is missing or not one of them.
    """
    heads = heads_of(path)
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
