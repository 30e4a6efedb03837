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
import itertools
import math
import mmap
import os
import pickle
from typing import Any

from .snapshot import Snapshotter, _as_given, _is_ndarray, _nbytes


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
        if self.pinned:  # page-locked for CUDA: unlocked before it is unmapped
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
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

    # through a memoryview, which the tensor holds: the map cannot be closed
    # under a tensor still alive (a NumPy view holds it the same way)
    view = torch.frombuffer(memoryview(buffer), dtype=dtype, count=math.prod(shape))
    return view.view(shape)


class SharedSnapshotter(Snapshotter):
    """Copy payloads into reused buffers of shared memory (see the module)."""

    def __init__(self) -> None:
        super().__init__("pinned")  # a host buffer is what the process maps
        self._idents = itertools.count(1)
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
        shared = self._share(path, source, _nbytes(source))
        if self.copies.handles(source):
            self._from_device(shared, source)
            self._cuda_bytes["pinned"] += _nbytes(source)
        else:
            shared.tensor.copy_(source)
        out = _as_given(value, source, shared.tensor)
        self._taken[id(out)] = shared
        return out

    def _array(self, value: Any, path: str) -> Any:
        dtype = value.dtype
        if value.size == 0 or dtype.hasobject or dtype.itemsize == 0:
            return super()._array(value, path)
        shared = self._share(path, value, value.nbytes)
        shared.tensor[...] = value
        self._taken[id(shared.tensor)] = shared
        return shared.tensor

    def _share(self, path: str, like: Any, nbytes: int) -> _Buffer:
        """The shared buffer of ``path``: the one it had if that holds a
        tensor (or array) of ``like``'s dtype and shape, else a new one."""
        shared = self._shared.get(path)
        if (
            shared is None
            or _is_ndarray(shared.tensor) != _is_ndarray(like)
            or shared.tensor.dtype != like.dtype
            or shared.tensor.shape != like.shape
        ):
            if shared is not None:
                shared.close()
            ident = next(self._idents)
            shared = self._shared[path] = _Buffer(ident, nbytes, like.dtype, like.shape)
        self._buffers[path] = shared.tensor
        return shared

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
            if _is_ndarray(shared.tensor):
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
        """Free every shared buffer (its views dropped first, so that its map closes)."""
        super().close()
        self._taken = {}
        for shared in self._shared.values():
            shared.close()
        self._shared.clear()
