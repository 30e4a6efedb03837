"""The NumPy/HDF5 reference format (suffix ``.h5``).

A payload is a nested mapping whose leaves are numpy arrays, numpy or Python
scalars (bool, int, float, complex), strings, ``None`` and lists or tuples of
these. Mappings become HDF5 groups; arrays and scalars become datasets; strings
and ``None`` become attributes; lists and tuples become groups tagged with
their kind whose members are named by position. Reading gives back the same
values with the same dtypes and shapes.

``h5py`` is imported only when a checkpoint is written or read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..hookspecs import hookimpl
from . import FormatInfo

NAME = "hdf5"
SUFFIX = ".h5"

_KIND = "dp_ckpt_kind"
#: Member holding a group's key order; escaped keys never start with "%".
_ORDER = "%order"


@hookimpl(trylast=True)
def register_formats():
    """Declare the HDF5 format."""
    return [FormatInfo(NAME, SUFFIX, "NumPy arrays in HDF5 (h5py)")]


@hookimpl(trylast=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO):
    """Write ``state`` as HDF5 into ``file``."""
    if format != NAME:
        return None
    import h5py

    if not isinstance(state, Mapping):
        raise TypeError(f"the hdf5 format saves a mapping, got {type(state).__name__}")
    with h5py.File(file, "w") as h5:
        h5.attrs["dp_ckpt_step"] = int(step)
        _write_group(h5, state)
    return True


@hookimpl(trylast=True)
def on_load_step(format: str, path: Path):
    """Read back a payload written by :func:`on_save_step`."""
    if format != NAME:
        return None
    import h5py

    with h5py.File(path, "r") as h5:
        return _read_group(h5)


def _write_group(group, mapping: Mapping) -> None:
    group.attrs[_KIND] = "dict"
    keys = []
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"the hdf5 format needs string keys, got {key!r}")
        keys.append(key)
        _write_value(group, _safe(key), value)
    group.create_dataset(_ORDER, data=_string_array(keys))


def _write_value(group, name: str, value: Any) -> None:
    import numpy as np

    if isinstance(value, Mapping):
        _write_group(group.create_group(name), value)
    elif isinstance(value, (list, tuple)):
        sub = group.create_group(name)
        sub.attrs[_KIND] = type(value).__name__
        sub.attrs["length"] = len(value)
        for index, item in enumerate(value):
            _write_value(sub, str(index), item)
    elif value is None:
        sub = group.create_group(name)
        sub.attrs[_KIND] = "none"
    elif isinstance(value, str):
        import h5py

        dset = group.create_dataset(name, data=value, dtype=h5py.string_dtype("utf-8"))
        dset.attrs[_KIND] = "str"
    elif isinstance(value, bytes):
        dset = group.create_dataset(name, data=np.void(value))
        dset.attrs[_KIND] = "bytes"
    elif isinstance(value, (bool, int, float, complex)):
        dset = group.create_dataset(name, data=value)
        dset.attrs[_KIND] = type(value).__name__
    elif isinstance(value, np.generic):
        dset = group.create_dataset(name, data=value)
        dset.attrs[_KIND] = "npscalar"
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "OUS":
            raise TypeError(
                f"the hdf5 format cannot store arrays of dtype {value.dtype} (key {name!r})"
            )
        dset = group.create_dataset(name, data=value)
        dset.attrs[_KIND] = "ndarray"
    else:
        raise TypeError(
            f"the hdf5 format cannot store {type(value).__name__} (key {name!r})"
        )


def _read_group(group) -> Any:
    kind = group.attrs.get(_KIND, "dict")
    if kind == "none":
        return None
    if kind in ("list", "tuple"):
        items = [_read_node(group[str(i)]) for i in range(int(group.attrs["length"]))]
        return items if kind == "list" else tuple(items)
    keys = [k.decode("utf-8") for k in group[_ORDER][()]]
    return {key: _read_node(group[_safe(key)]) for key in keys}


def _read_node(node) -> Any:
    import h5py

    if isinstance(node, h5py.Group):
        return _read_group(node)
    kind = node.attrs.get(_KIND, "ndarray")
    if kind == "ndarray":
        return node[...]
    value = node[()]
    if kind == "npscalar":
        return value  # h5py returns a numpy scalar of the stored dtype
    if kind == "str":
        return value.decode("utf-8")
    if kind == "bytes":
        return value.tobytes()
    return {"bool": bool, "int": int, "float": float, "complex": complex}[kind](value)


def _safe(key: str) -> str:
    """Escape a key into an HDF5 member name ('/' and '.' are special)."""
    if key in ("", ".") or "/" in key or key.startswith("%"):
        return "%" + key.encode("utf-8").hex()
    return key


def _string_array(keys: list[str]):
    import h5py
    import numpy as np

    return np.array(keys, dtype=h5py.string_dtype("utf-8"))
