"""A consistent copy of a payload, cheap enough to take in the training loop.

An asynchronous save must not serialize live tensors that the next optimizer
step mutates. :class:`Snapshotter` copies a payload's arrays and tensors into
buffers it keeps from one save to the next (``copy_`` / ``buffer[...] = array`` into a
buffer of the same shape and dtype, which costs a memory copy and no
allocation), rebuilds the containers around them and shares immutable leaves
(numbers, strings, bytes, ``None``). Buffers are reused only once the save
that used them has finished; the store guarantees that (at most one save in
flight).

A CUDA tensor is copied one of two ways (``CUDA_COPIES``, chosen by
``DP_CKPT_CUDA_COPY``):

``device`` (the default)
    a copy on the device: fast, and the payload keeps its devices, but the
    state's size again in GPU memory while a save is in flight;
``pinned``
    into page-locked host buffers allocated once per layout and reused,
    filled on a side stream (``SideStreamCopies``): no GPU memory, the
    loop's stream waits for the copy before its next kernels, and the writer
    waits for it (:meth:`Snapshotter.ready`) before serializing; the payload
    holds host tensors (loaders map them, as deepmd-kit's ``torch.load(...,
    map_location=DEVICE)`` does).

The first snapshot holding a CUDA tensor logs which way and what memory it
costs. A tensor whose layout (shape, dtype, device) changed gets a new
buffer, never a copy into the old one.

Nothing here imports torch at module level: tensors are recognised by their
methods.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any

from ..errors import ConfigError
from ..text import shown

log = logging.getLogger("dp_ckpt_plugin")

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)
#: The ways a background save copies a CUDA tensor (see the module).
CUDA_COPIES = ("device", "pinned")
#: What the first snapshot holding a CUDA tensor logs, by way (the MiB it costs).
_SAID = {
    "device": "background saves copy CUDA tensors on the device: %.1f MiB of GPU "
    "memory while a save is in flight (DP_CKPT_CUDA_COPY=pinned copies "
    "into pinned host memory instead)",
    "pinned": "background saves copy CUDA tensors into %.1f MiB of pinned host "
    "memory on a side stream: no GPU memory "
    "(DP_CKPT_CUDA_COPY=device copies on the device instead)",
}


def cuda_copy_way(asked: str | None = None) -> str:
    """The way CUDA tensors are copied: ``asked``, else ``DP_CKPT_CUDA_COPY``, else ``device``."""
    way = asked or os.environ.get("DP_CKPT_CUDA_COPY", "").strip() or "device"
    if way not in CUDA_COPIES:
        raise ConfigError(
            f"DP_CKPT_CUDA_COPY must be one of {', '.join(CUDA_COPIES)}, "
            f"got {shown(way)}"
        )
    return way


class SideStreamCopies:
    """Device-to-host copies on one side stream per device, waited for by the writer.

    Each snapshot's copies start after every kernel the loop queued so far;
    :meth:`finish` makes the loop's stream wait for them (the next step does
    not change a tensor being copied) and records an event that :meth:`wait`
    (the writer) waits on.
    """

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}
        self._open: dict[Any, Any] = {}
        self._events: list[Any] = []

    def handles(self, source: Any) -> bool:
        """Whether ``source`` lives on a device these copies serve (CUDA)."""
        return source.device.type == "cuda"

    def host_buffer(self, source: Any) -> Any:
        """A page-locked host tensor of ``source``'s shape and dtype."""
        import torch

        return torch.empty(
            source.shape, dtype=source.dtype, device="cpu", pin_memory=True
        )

    def copy(self, buffer: Any, source: Any, *, pinned: bool = True) -> None:
        """Queue the copy of ``source`` into the host ``buffer`` on the side stream."""
        import torch

        device = source.device
        side = self._open.get(device)
        if side is None:
            side = self._streams.get(device)
            if side is None:
                side = self._streams[device] = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            self._open[device] = side
        with torch.cuda.stream(side):
            buffer.copy_(source, non_blocking=pinned)
        source.record_stream(side)

    def finish(self) -> None:
        """End a snapshot's copies: the loop's stream waits for them; record events."""
        if not self._open:  # nothing was copied (a CPU or NumPy state)
            return
        import torch

        for device, side in self._open.items():
            event = torch.cuda.Event()
            event.record(side)
            torch.cuda.current_stream(device).wait_stream(side)
            self._events.append(event)
        self._open = {}

    def wait(self) -> None:
        """Wait until every copy of the last snapshot is done."""
        events, self._events = self._events, []
        for event in events:
            event.synchronize()


class Snapshotter:
    """Copy payloads into reused buffers keyed by their key path.

    Parameters
    ----------
    cuda_copy : {"device", "pinned"}, optional
        How a CUDA tensor is copied (see the module); ``DP_CKPT_CUDA_COPY``,
        else ``device``, when not given.
    copies : optional
        The device-to-host copies of the ``pinned`` way.
    """

    def __init__(
        self, cuda_copy: str | None = None, copies: SideStreamCopies | None = None
    ) -> None:
        self._buffers: dict[str, Any] = {}
        #: The layout each pinned buffer was made for (shape, dtype, device).
        self._layouts: dict[str, tuple] = {}
        self.cuda_copy = cuda_copy_way(cuda_copy)
        self.copies = copies or SideStreamCopies()
        self._said = False
        #: The bytes of CUDA tensors the snapshot being taken copies, by way.
        self._cuda_bytes: collections.Counter[str] = collections.Counter()

    def take(self, state: Any) -> Any:
        """Return a copy of ``state`` that later changes to ``state`` do not touch."""
        seen: set[str] = set()
        self._cuda_bytes.clear()
        copy = self._copy(state, "", seen)
        self.copies.finish()
        for stale in set(self._buffers) - seen:
            del self._buffers[stale]
            self._layouts.pop(stale, None)
        if not self._said and self._cuda_bytes.total():
            self._said = True
            mib = self._cuda_bytes[self.cuda_copy] / (1 << 20)
            log.info(_SAID[self.cuda_copy], mib)
        return copy

    def ready(self) -> None:
        """Wait until the last snapshot's device-to-host copies are done."""
        self.copies.wait()

    def close(self) -> None:
        """Let go of every buffer (the state's size, on the host or a device).

        A snapshot still referenced keeps its own; a later :meth:`take`
        makes new ones.
        """
        self._buffers.clear()
        self._layouts.clear()

    def _copy(self, value: Any, path: str, seen: set[str]) -> Any:
        kind = type(value)
        if kind in _IMMUTABLE:
            return value
        if kind in (dict, collections.OrderedDict):
            items = value.items()
            return kind((k, self._copy(v, f"{path}/{k!r}", seen)) for k, v in items)
        if kind in (list, tuple):
            return kind(self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(value))
        if hasattr(value, "detach") and hasattr(value, "copy_"):  # a tensor
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
        if (
            self.cuda_copy == "pinned"
            and self.copies.handles(source)
            and str(source.layout) == "torch.strided"
            and not source.is_quantized
        ):
            buffer = self._pinned(source, path)
        else:
            buffer = self._same_device(source, path)
            if self.copies.handles(source):
                self._cuda_bytes["device"] += _nbytes(source)
        return _as_given(value, source, buffer)

    def _same_device(self, source: Any, path: str) -> Any:
        buffer = self._buffers.get(path)
        if (
            buffer is None
            or path in self._layouts
            or _layout(buffer) != _layout(source)
            or not source.is_contiguous()
        ):
            buffer = self._buffers[path] = source.clone()
            self._layouts.pop(path, None)
        else:
            buffer.copy_(source)
        return buffer

    def _pinned(self, source: Any, path: str) -> Any:
        layout = (tuple(source.shape), source.dtype, source.device)
        buffer = self._buffers.get(path)
        if buffer is None or self._layouts.get(path) != layout:
            buffer = self._buffers[path] = self.copies.host_buffer(source)
            self._layouts[path] = layout
        self.copies.copy(buffer, source)
        self._cuda_bytes["pinned"] += _nbytes(source)
        return buffer

    def _array(self, value: Any, path: str) -> Any:
        buffer = self._buffers.get(path)
        if (
            buffer is None
            or buffer.shape != value.shape
            or buffer.dtype != value.dtype
            or type(buffer) is not type(value)
        ):
            buffer = self._buffers[path] = value.copy()
        else:
            buffer[...] = value
        return buffer


def _as_given(value: Any, source: Any, buffer: Any) -> Any:
    """``buffer`` as what ``value`` was: a Parameter stays a Parameter."""
    if type(value) is not type(source):
        return type(value)(buffer, requires_grad=value.requires_grad)
    return buffer


def _layout(tensor: Any) -> tuple:
    return (tensor.shape, tensor.dtype, tensor.device, tensor.layout)


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _is_ndarray(value: Any) -> bool:
    return type(value).__name__ == "ndarray" and hasattr(value, "__array_interface__")
