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
import threading
from pathlib import Path
from typing import Any, BinaryIO

from ..markers import hookimpl
from ..storage.forks import in_child
from . import FormatInfo, reading

NAME = "torch"
SUFFIX = ".pt"

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

    leaves = (torch.Tensor, torch.nn.Parameter, torch.dtype, torch.device, torch.Size)
    _check(state, "", _PLAIN + leaves)


def _check(value: Any, path: str, leaves: tuple[type, ...]) -> None:
    import numpy as np

    where = path or "/"
    kind = type(value)
    if kind in (dict, collections.OrderedDict):
        for key, item in value.items():
            _check(key, f"{path}/<key {key!r}>", leaves)
            _check(item, f"{path}/{key}", leaves)
    elif kind in (list, tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}/{index}", leaves)
    elif kind in (set, frozenset):
        for item in value:
            _check(item, f"{path}/<member {item!r}>", leaves)
    elif kind in leaves:
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


@hookimpl(trylast=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO):
    """Write ``state`` with ``torch.save`` into ``file``, torch's defaults unchanged.

    When the storage names the open file by a path (``file.os_path``), torch
    writes to that path: its own file writer is faster than writes through
    a Python file object (about 200 ms against 300 ms for 256 MiB here), and
    the path ends in the checkpoint's final name, so the file is byte for
    byte what ``torch.save(state, final_path)`` writes (torch names the
    folder inside its zip archive after the file). Nothing of torch's
    configuration is changed: the archive keeps its CRC32 of every member
    (``unzip -t`` and ``zipfile`` check them), and a ``torch.save`` of
    another thread meanwhile is not touched.
    """
    if format != NAME:
        return None
    import torch

    torch.save(state, getattr(file, "os_path", None) or file)
    return True


@hookimpl(trylast=True)
def on_load_step(format: str, path: Path, file: BinaryIO | None):
    """Read a checkpoint from ``file`` with ``torch.load(weights_only=True)`` on the CPU.

    torch's allowlist of globals is process-wide (it has no per-call one):
    it is left untouched unless the checkpoint names one of
    :func:`safe_globals` (a payload holding NumPy values), and then widened
    for the load by :func:`_allowing` only, thread-safely.
    """
    if format != NAME:
        return None
    import torch

    source = reading(path, file)
    with _allowing(torch, source):
        return torch.load(source, map_location="cpu", weights_only=True)


def _needed(torch, source: BinaryIO) -> list:
    """:func:`safe_globals` if the checkpoint in ``source`` names one of them, else none.

    The scan reads the bytes already held; ``source`` is rewound after it.
    """
    try:
        named = set(torch.serialization.get_unsafe_globals_in_checkpoint(source))
    except Exception:  # not an archive torch reads: torch.load says why
        return []
    finally:
        source.seek(0)
    allowed = safe_globals()
    # all of them once one is named: torch's scan does not list every class
    # the unpickler meets (NumPy's dtype classes come through numpy.dtype)
    return allowed if any(_names(g, n) for g in allowed for n in named) else []


def _names(value, name: str) -> bool:
    """Whether the pickled global ``name`` is ``value`` (``numpy.core`` or ``_core``)."""
    module, qualname = value.__module__, value.__qualname__
    return name == f"{module}.{qualname}" or (
        name.endswith(f".{qualname}") and name.split(".")[0] == module.split(".")[0]
    )


#: Loads in flight that widened torch's allowlist, and what they added.
_ALLOWED: dict = {"loads": 0, "added": []}
_ALLOWED_LOCK = threading.Lock()


@in_child
def _forked() -> None:
    """The loads in flight at a fork are threads the child lacks: end them."""
    global _ALLOWED_LOCK
    _ALLOWED_LOCK = threading.Lock()
    if _ALLOWED["loads"]:
        _ALLOWED["loads"] = 0
        _remove(_ALLOWED["added"])
        _ALLOWED["added"] = []


@contextlib.contextmanager
def _allowing(torch, source: BinaryIO):
    """Widen torch's allowlist for a load of ``source`` that needs it (:func:`_needed`).

    Only what the list lacks is added, and only that is removed, by the
    last load in flight to finish (a count under a lock): a global the user
    allowed stays allowed, and a load of another thread never loses one
    midway. While loads of ours are in flight torch's scan cannot tell what
    a file needs (it reports only globals not yet allowed): a load then
    counts itself in. Nothing is changed for a checkpoint without NumPy
    values or ``bytes``.
    """
    from torch.serialization import add_safe_globals, get_safe_globals

    with _ALLOWED_LOCK:
        extra = safe_globals() if _ALLOWED["loads"] else _needed(torch, source)
        if extra:
            have = set(get_safe_globals())
            missing = [g for g in extra if g not in have]
            add_safe_globals(missing)
            _ALLOWED["added"] += missing
            _ALLOWED["loads"] += 1
    try:
        yield
    finally:
        if extra:
            with _ALLOWED_LOCK:
                _ALLOWED["loads"] -= 1
                if _ALLOWED["loads"] == 0:
                    _remove(_ALLOWED["added"])
                    _ALLOWED["added"] = []


def _remove(added: list) -> None:
    """Take ``added`` out of torch's allowlist, leaving everything else in it."""
    from torch import _weights_only_unpickler as unpickler

    remove = getattr(unpickler, "_remove_safe_globals", None)
    if remove is not None:  # one assignment of torch's set: what safe_globals does
        remove(added)
        return
    from torch.serialization import (
        add_safe_globals,
        clear_safe_globals,
        get_safe_globals,
    )

    kept = [g for g in get_safe_globals() if g not in added]
    clear_safe_globals()
    add_safe_globals(kept)


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
