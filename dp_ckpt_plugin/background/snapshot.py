"""A consistent copy of a payload, cheap enough to take in the training loop.

An asynchronous save must not serialize live tensors that the next optimizer
step mutates. :class:`Snapshotter` copies a payload's arrays and tensors into
buffers it keeps from one save to the next (``copy_`` / ``np.copyto`` into a
buffer of the same shape and dtype, which costs a memory copy and no
allocation), rebuilds the containers around them and shares immutable leaves
(numbers, strings, bytes, ``None``). Buffers are reused only once the save
that used them has finished; the store guarantees that (at most one save in
flight).

Nothing here imports torch: tensors are recognised by their methods.
"""

from __future__ import annotations

import collections
from typing import Any

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


class Snapshotter:
    """Copy payloads into reused buffers keyed by their key path."""

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}

    def take(self, state: Any) -> Any:
        """Return a copy of ``state`` that later changes to ``state`` do not touch."""
        seen: set[str] = set()
        copy = self._copy(state, "", seen)
        for stale in set(self._buffers) - seen:
            del self._buffers[stale]
        return copy

    def _copy(self, value: Any, path: str, seen: set[str]) -> Any:
        kind = type(value)
        if kind in _IMMUTABLE:
            return value
        if kind in (dict, collections.OrderedDict):
            out = kind()
            for key, item in value.items():
                out[key] = self._copy(item, f"{path}/{key!r}", seen)
            return out
        if kind in (list, tuple):
            return kind(self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(value))
        if _is_tensor(value):
            seen.add(path)
            return self._tensor(value, path)
        if _is_ndarray(value):
            seen.add(path)
            return self._array(value, path)
        if hasattr(value, "dtype") and hasattr(value, "shape"):  # numpy scalar
            return value.copy() if hasattr(value, "copy") else value
        # anything else (torch.dtype, torch.Size, sets...) is copied by value
        import copy

        return copy.deepcopy(value)

    def _tensor(self, value: Any, path: str) -> Any:
        source = value.detach()
        buffer = self._buffers.get(path)
        if (
            buffer is None
            or buffer.shape != source.shape
            or buffer.dtype != source.dtype
            or buffer.device != source.device
            or buffer.layout != source.layout
            or not source.is_contiguous()
        ):
            buffer = source.clone()
            self._buffers[path] = buffer
        else:
            buffer.copy_(source)
        if type(value) is not type(source):  # a Parameter stays a Parameter
            return type(value)(buffer, requires_grad=value.requires_grad)
        return buffer

    def _array(self, value: Any, path: str) -> Any:
        import numpy as np

        buffer = self._buffers.get(path)
        if (
            buffer is None
            or buffer.shape != value.shape
            or buffer.dtype != value.dtype
            or type(buffer) is not type(value)
        ):
            buffer = value.copy()
            self._buffers[path] = buffer
        else:
            np.copyto(buffer, value)
        return buffer


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "copy_")


def _is_ndarray(value: Any) -> bool:
    return type(value).__name__ == "ndarray" and hasattr(value, "__array_interface__")
