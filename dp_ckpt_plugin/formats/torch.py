"""The PyTorch format (suffix ``.pt``): ``torch.save`` through the store.

The store hands this format an open temporary file; ``torch.save`` writes the
payload (for deepmd-kit, the dict of model, optimizer and EMA state) into it,
and the store makes it durable and atomic.

Load policy. A checkpoint is read with ``torch.load(weights_only=True)``, as
deepmd-kit reads its own: a pickle can run any code on load, and a checkpoint
directory may hold files that came from elsewhere (a copied run, a shared
scratch disk). ``weights_only`` limits what a file can make Python build to
tensors, containers and plain values. Beside those, exactly the NumPy
globals needed to rebuild arrays and scalars (``numpy.ndarray``,
``numpy.dtype`` and its dtype classes, the array and scalar reconstructors)
and the ``bytes`` type (pickle rebuilds an empty ``bytes`` by calling it)
are allowed, so a payload holding NumPy values loads too.

Round trips are exact (rule 23): :func:`check_state` refuses, before any file
is created, a value this policy could not read back as it was saved, with a
:class:`TypeError` naming the key path: objects of other classes (subclasses
of supported ones included, except ``torch.nn.Parameter``), NumPy object
dtypes, non-native byte order and NumPy string scalars.

torch is imported only when a checkpoint is written or read, never when this
module is imported.
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path
from typing import Any, BinaryIO

from ..hookspecs import hookimpl
from . import FormatInfo, reading

NAME = "torch"
SUFFIX = ".pt"

_CONTAINERS = (dict, collections.OrderedDict, list, tuple, set, frozenset)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)


@hookimpl(trylast=True)
def register_formats():
    """Declare the torch format."""
    return [
        FormatInfo(
            NAME, SUFFIX, "torch.save / torch.load(weights_only=True)", check_state
        )
    ]


def check_state(state: Any) -> None:
    """Raise :class:`TypeError` naming the key path of a value not read back exactly."""
    import torch

    _check(state, "", torch)


def _check(value: Any, path: str, torch) -> None:
    import numpy as np

    where = path or "/"
    kind = type(value)
    if kind in (dict, collections.OrderedDict):
        for key, item in value.items():
            _check(key, f"{path}/<key {key!r}>", torch)
            _check(item, f"{path}/{key}", torch)
    elif kind in (list, tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}/{index}", torch)
    elif kind in (set, frozenset):
        for item in value:
            _check(item, f"{path}/<member {item!r}>", torch)
    elif kind in _PLAIN or kind in _torch_leaves(torch):
        return
    elif kind is np.ndarray or (
        isinstance(value, np.generic) and kind is np.dtype(kind).type
    ):
        dtype = value.dtype
        if dtype.hasobject or dtype.byteorder not in "=|":
            raise TypeError(
                f"the torch format cannot read back dtype {dtype.str} exactly "
                f"(key {where}); use a native, non-object dtype"
            )
        if kind in (np.str_, np.bytes_):
            raise TypeError(
                f"the torch format cannot read back a {kind.__name__} scalar "
                f"(key {where}); store a str or bytes"
            )
    else:
        raise TypeError(
            f"the torch format cannot store {kind.__module__}.{kind.__qualname__} "
            f"so that torch.load(weights_only=True) reads it back (key {where})"
        )


def _torch_leaves(torch) -> tuple:
    return (torch.Tensor, torch.nn.Parameter, torch.dtype, torch.device, torch.Size)


@hookimpl(trylast=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO):
    """Write ``state`` with ``torch.save`` into ``file``.

    When the storage names the open file by a path (``file.os_path``), torch
    writes to that path: its own file writer is faster than writes through
    a Python file object (about 200 ms against 300 ms for 256 MiB here).
    """
    if format != NAME:
        return None
    import torch

    with _without_zip_crc32():
        torch.save(state, getattr(file, "os_path", None) or file)
    return True


def _without_zip_crc32():
    """Skip the CRC32 torch's zip writer computes: the store's digest covers it.

    The archive stays a valid zip that ``torch.load`` (and plain deepmd-kit)
    reads; only the redundant checksum pass over the bytes goes.
    """
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch without the option: keep its default
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})


@hookimpl(trylast=True)
def on_load_step(format: str, path: Path, file: BinaryIO | None):
    """Read a checkpoint from ``file`` with ``torch.load(weights_only=True)`` on the CPU."""
    if format != NAME:
        return None
    import torch

    source = reading(path, file)
    with torch.serialization.safe_globals(safe_globals()):
        return torch.load(source, map_location="cpu", weights_only=True)


def safe_globals() -> list:
    """The globals beyond torch's own that loading allows, nothing more."""
    import numpy as np

    try:
        multiarray = np._core.multiarray
    except AttributeError:  # NumPy 1
        multiarray = np.core.multiarray
    dtypes = [
        getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")
    ]
    # ``bytes`` rebuilds an empty bytes value, which pickle writes as a call
    return [
        multiarray._reconstruct,
        multiarray.scalar,
        np.ndarray,
        np.dtype,
        *dtypes,
        bytes,
    ]
