"""The PyTorch format (suffix ``.pt``): ``torch.save`` through the store.

The store hands this format an open temporary file; ``torch.save`` writes the
payload (for deepmd-kit, the dict of model, optimizer and EMA state) into it,
and the store makes it durable and atomic. Loading uses ``weights_only=True``,
which deepmd-kit's checkpoints allow.

torch is imported only when a checkpoint is written or read, never when this
module is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from ..hookspecs import hookimpl
from . import FormatInfo

NAME = "torch"
SUFFIX = ".pt"


@hookimpl(trylast=True)
def register_formats():
    """Declare the torch format."""
    return [FormatInfo(NAME, SUFFIX, "torch.save / torch.load(weights_only=True)")]


@hookimpl(trylast=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO):
    """Write ``state`` with ``torch.save`` into ``file``."""
    if format != NAME:
        return None
    import torch

    torch.save(state, file)
    return True


@hookimpl(trylast=True)
def on_load_step(format: str, path: Path):
    """Read a checkpoint with ``torch.load(..., weights_only=True)`` on the CPU."""
    if format != NAME:
        return None
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)
