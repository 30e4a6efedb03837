"""Snapshot buffers in shared memory, for a writer in another process.

:class:`SharedSnapshotter` is the :class:`~dp_ckpt_plugin.background.snapshot.Snapshotter`
of a store whose background saves are written by a writer process
(:mod:`~dp_ckpt_plugin.background.process`): each tensor and NumPy array of the
payload is copied into a buffer of anonymous shared memory (``memfd_create``), allocated once
and reused from save to save, which the writer process maps once. The
snapshot is then pickled with each shared buffer replaced by a reference
(``pickle``'s persistent ids), so only the structure of the payload crosses
to the writer, never its bytes.

A tensor on a CUDA device is copied into its (page-locked, when CUDA allows)
host buffer on a side stream, the ``pinned`` way of the thread writer
(``SideStreamCopies``): the
training stream waits for that copy before its next kernels, so the loop
does not wait for it; the save waits for it before the writer reads the
buffer (:meth:`Snapshotter.ready`). That path was not measured on a GPU
(see ``docs/performance.md``).

Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import pickle
from typing import Any

from .snapshot import Snapshotter


class _Buffer:
    """One shared buffer: its memory file, map and the tensor or array viewing it."""

    def __init__(self, ident: int, nbytes: int, dtype, shape) -> None:
        self.ident = ident
        self.fd = os.memfd_create(f"dp_ckpt-snapshot-{ident}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes)
        self.tensor = view_of(self.map, dtype, shape)
        self.pinned = False

    def close(self) -> None:
        self.tensor = None
        with contextlib.suppress(BufferError):  # a view alive: it goes with it
            self.map.close()
        os.close(self.fd)


def view_of(buffer, dtype, shape):
    """A tensor (``dtype`` a ``torch.dtype``) or NumPy array viewing ``buffer``.

    The writer process rebuilds the payload's leaves with it, from the
    dtype and shape the persistent id carries (:meth:`SharedSnapshotter.pickled`).
    """
    import numpy as np

    if isinstance(dtype, np.dtype):
        return np.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).reshape(shape)
    import torch

    return torch.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).view(shape)


class SharedSnapshotter(Snapshotter):
    """Copy payloads into reused buffers of shared memory (see the module)."""

    def __init__(self) -> None:
        super().__init__("pinned")  # a host buffer is what the process maps
        self._next = 0
        self._shared: dict[str, _Buffer] = {}
        #: id() of each tensor of the last snapshot -> its buffer.
        self._taken: dict[int, _Buffer] = {}

    def take(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in shared buffers."""
        self._taken = {}
        copy = super().take(state)
        for stale in set(self._shared) - set(self._buffers):
            self._shared.pop(stale).close()
        return copy

    def _tensor(self, value: Any, path: str) -> Any:
        source = value.detach()
        if (
            source.layout.__str__() != "torch.strided"
            or source.device.type not in ("cpu", "cuda")
            or source.numel() == 0
            or source.is_quantized
        ):
            return super()._tensor(value, path)
        shared = self._shared.get(path)
        nbytes = source.numel() * source.element_size()
        if (
            shared is None
            or type(shared.tensor).__name__ == "ndarray"
            or shared.tensor.shape != source.shape
            or shared.tensor.dtype != source.dtype
        ):
            shared = self._fresh(path, nbytes, source.dtype, source.shape)
        self._buffers[path] = shared.tensor
        if self.copies.handles(source):
            self._from_device(shared, source)
            self._pinned_bytes += nbytes
        else:
            shared.tensor.copy_(source)
        out = shared.tensor
        if type(value) is not type(source):  # a Parameter stays a Parameter
            out = type(value)(out, requires_grad=value.requires_grad)
        self._taken[id(out)] = shared
        return out

    def _array(self, value: Any, path: str) -> Any:
        dtype = value.dtype
        if value.size == 0 or dtype.hasobject or dtype.itemsize == 0:
            return super()._array(value, path)
        shared = self._shared.get(path)
        if (
            shared is None
            or type(shared.tensor) is not type(value)
            or shared.tensor.dtype != dtype
            or shared.tensor.shape != value.shape
        ):
            shared = self._fresh(path, value.nbytes, dtype, value.shape)
        self._buffers[path] = shared.tensor
        import numpy as np

        np.copyto(shared.tensor, value)
        self._taken[id(shared.tensor)] = shared
        return shared.tensor

    def _fresh(self, path: str, nbytes: int, dtype, shape) -> _Buffer:
        """A new shared buffer for ``path``, in place of the one it had."""
        old = self._shared.get(path)
        if old is not None:
            old.close()
        self._next += 1
        self._shared[path] = _Buffer(self._next, nbytes, dtype, shape)
        return self._shared[path]

    def _from_device(self, shared: _Buffer, source: Any) -> None:
        """Queue the copy of a CUDA tensor into its host buffer on the side stream."""
        import torch

        if not shared.pinned:
            ptr, size = shared.tensor.data_ptr(), shared.map.size()
            shared.pinned = torch.cuda.cudart().cudaHostRegister(ptr, size, 0) == 0
        self.copies.copy(shared.tensor, source, pinned=shared.pinned)

    def pickled(self, snapshot: Any) -> tuple[bytes, dict[int, int]]:
        """Pickle the last snapshot taken, its shared tensors as references.

        Returns the bytes and the buffers they refer to (ident to the
        descriptor of its memory file).
        """
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        taken = self._taken
        used: dict[int, int] = {}

        def persistent_id(obj: Any):
            shared = taken.get(id(obj))
            if shared is None:
                return None
            used[shared.ident] = shared.fd
            shape = tuple(shared.tensor.shape)
            if type(shared.tensor).__name__ == "ndarray":
                dtype, kind, grad = shared.tensor.dtype.str, "ndarray", False
            else:
                kind = "parameter" if type(obj) is not type(shared.tensor) else "tensor"
                grad = bool(getattr(obj, "requires_grad", False))
                dtype = str(shared.tensor.dtype).removeprefix("torch.")
            return ("shared", shared.ident, dtype, shape, kind, grad)

        pickler.persistent_id = persistent_id
        pickler.dump(snapshot)
        return out.getvalue(), used

    def close(self) -> None:
        """Free every shared buffer."""
        for shared in self._shared.values():
            shared.close()
        self._shared.clear()
        self._buffers.clear()
