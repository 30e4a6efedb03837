"""The NumPy/HDF5 reference format (suffix ``.h5``).

A payload is a nested ``dict`` with ``str`` keys whose leaves are NumPy arrays
and scalars, Python ``bool``, ``int`` (any size), ``float``, ``complex``,
``str``, ``bytes``, ``None``, and ``list`` or ``tuple`` of these. Dicts become
HDF5 groups, lists and tuples groups tagged with their kind, leaves datasets.
Reading gives back the same values with the same types, dtypes and shapes
(rule 23). Anything else, a subclass of a supported type included (an
``OrderedDict``, an ``IntEnum``, ``np.matrix``), is refused by
:func:`check_state` with a :class:`TypeError` naming the key path, before the
store creates any file.

Numeric arrays of native byte order are stored as plain HDF5 datasets that
any HDF5 tool reads; other fixed-size dtypes (``datetime64``, fixed-width
strings, non-native byte order, extended precision) are stored as raw bytes
with their dtype. Object and structured dtypes are refused.

``h5py`` is imported only when a checkpoint is written or read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, BinaryIO

from ..markers import hookimpl
from . import FormatInfo, reading

NAME = "hdf5"
SUFFIX = ".h5"

_KIND = "dp_ckpt_kind"
_DTYPE = "dp_ckpt_dtype"
_LAYOUT = "dp_ckpt_layout"
#: Layout of this version; files without the attribute use the first layout.
LAYOUT = 2
#: Member holding a group's key order.
_ORDER = "%order"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_\-.]*")
_INT64 = (-(2**63), 2**63 - 1)
_PY_SCALARS = {bool: "bool", int: "int", float: "float", complex: "complex"}
_PY_TYPES = {name: kind for kind, name in _PY_SCALARS.items()}


@hookimpl(trylast=True)
def register_formats():
    """Declare the HDF5 format."""
    return [FormatInfo(NAME, SUFFIX, "NumPy arrays in HDF5 (h5py)", check_state)]


def check_state(state: Any) -> None:
    """Raise :class:`TypeError` naming the key path of a value not stored exactly."""
    if type(state) is not dict:
        raise TypeError(f"the hdf5 format saves a dict, got {type(state).__name__}")
    _check(state, "")


def _check(value: Any, path: str) -> None:
    import numpy as np

    where = path or "/"
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(
                    f"the hdf5 format needs str keys, got {key!r} at {where}"
                )
            _check(item, f"{path}/{key}")
    elif kind in (list, tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}/{index}")
    elif value is None or kind in (str, bytes) or kind in _PY_SCALARS:
        return
    elif kind is np.ndarray or (
        isinstance(value, np.generic) and kind is np.dtype(kind).type
    ):
        dtype = value.dtype
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
            raise TypeError(f"the hdf5 format cannot store dtype {dtype} (key {where})")
    else:
        raise TypeError(
            f"the hdf5 format cannot store {kind.__module__}.{kind.__qualname__} "
            f"exactly (key {where}); convert it to a supported type"
        )


@hookimpl(trylast=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO):
    """Write ``state`` as HDF5 into ``file``."""
    if format != NAME:
        return None
    import h5py

    check_state(state)
    with h5py.File(file, "w") as h5:
        h5.attrs["dp_ckpt_step"] = int(step)
        h5.attrs[_LAYOUT] = LAYOUT
        _write_group(h5, state)
    return True


@hookimpl(trylast=True)
def on_load_step(format: str, path: Path, file: BinaryIO | None):
    """Read back a payload written by :func:`on_save_step`, from ``file``."""
    if format != NAME:
        return None
    import h5py

    with h5py.File(reading(path, file), "r") as h5:
        return _read_group(h5, v1=int(h5.attrs.get(_LAYOUT, 1)) < 2)


# -- writing ---------------------------------------------------------------------


def _write_group(group, mapping: dict) -> None:
    group.attrs[_KIND] = "dict"
    for key, value in mapping.items():
        _write_value(group, _member(key), value)
    _write_bytes(group, _ORDER, json.dumps(list(mapping)).encode("ascii"), "order")


def _write_value(group, name: str, value: Any) -> None:
    import numpy as np

    kind = type(value)
    if kind is dict:
        _write_group(group.create_group(name), value)
    elif kind in (list, tuple):
        sub = group.create_group(name)
        sub.attrs[_KIND] = kind.__name__
        sub.attrs["length"] = len(value)
        for index, item in enumerate(value):
            _write_value(sub, str(index), item)
    elif value is None:
        group.create_group(name).attrs[_KIND] = "none"
    elif kind is str:
        _write_bytes(group, name, value.encode("utf-8", "surrogatepass"), "str")
    elif kind is bytes:
        _write_bytes(group, name, value, "bytes")
    elif kind is int and not _INT64[0] <= value <= _INT64[1]:
        _write_bytes(group, name, str(value).encode("ascii"), "bigint")
    elif kind in _PY_SCALARS:
        group.create_dataset(name, data=value).attrs[_KIND] = _PY_SCALARS[kind]
    elif _native(value.dtype):
        dset = group.create_dataset(name, data=value)
        dset.attrs[_KIND] = "ndarray" if kind is np.ndarray else "npscalar"
    else:
        raw = np.frombuffer(np.ascontiguousarray(value).tobytes(), dtype=np.uint8)
        dset = group.create_dataset(name, data=raw)
        dset.attrs[_KIND] = "rawarray" if kind is np.ndarray else "rawscalar"
        dset.attrs[_DTYPE] = value.dtype.str
        dset.attrs["shape"] = np.asarray(np.shape(value), dtype=np.int64)


def _write_bytes(group, name: str, data: bytes, kind: str) -> None:
    import numpy as np

    dset = group.create_dataset(name, data=np.frombuffer(data, dtype=np.uint8))
    dset.attrs[_KIND] = kind


def _native(dtype) -> bool:
    """Whether h5py stores and reads back ``dtype`` exactly as a plain dataset."""
    import numpy as np

    return (
        dtype.kind in "biufc"
        and dtype.byteorder in "=|"
        and dtype not in (np.dtype(np.longdouble), np.dtype(np.clongdouble))
    )


def _member(key: str) -> str:
    """An HDF5 member name for ``key`` ('/' and '.' are special, NUL not allowed)."""
    if _PLAIN_NAME.fullmatch(key):
        return key
    return "%" + key.encode("utf-8", "surrogatepass").hex()


# -- reading ---------------------------------------------------------------------


def _read_group(group, v1: bool = False) -> Any:
    """A group of either layout (``v1``: the first one, of dp-ckpt-plugin 0.1)."""
    kind = group.attrs.get(_KIND, "dict")
    if kind == "none":
        return None
    if kind in ("list", "tuple"):
        length = int(group.attrs["length"])
        items = [_read_node(group[str(i)], v1) for i in range(length)]
        return items if kind == "list" else tuple(items)
    if v1:
        keys = [k.decode("utf-8") for k in group[_ORDER][()]]
        return {key: _read_node(group[_safe_v1(key)], v1) for key in keys}
    keys = json.loads(group[_ORDER][...].tobytes().decode("ascii"))
    return {key: _read_node(group[_member(key)]) for key in keys}


def _read_node(node, v1: bool = False) -> Any:
    import h5py
    import numpy as np

    if isinstance(node, h5py.Group):
        return _read_group(node, v1)
    kind = node.attrs.get(_KIND, "ndarray")
    if kind == "ndarray":
        return node[...]
    if kind == "npscalar":
        return node[()]
    if v1 and kind in ("str", "bytes"):  # the first layout: a scalar each
        value = node[()]
        return value.decode("utf-8") if kind == "str" else value.tobytes()
    if kind in ("rawarray", "rawscalar"):
        dtype = np.dtype(node.attrs[_DTYPE])
        shape = tuple(int(n) for n in node.attrs["shape"])
        if dtype.itemsize == 0:  # such as the empty np.str_ scalar, dtype <U0
            array = np.zeros(shape, dtype=dtype)
        else:
            data = node[...].tobytes()
            array = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        return array if kind == "rawarray" else array[()]
    if kind == "str":
        return node[...].tobytes().decode("utf-8", "surrogatepass")
    if kind == "bytes":
        return node[...].tobytes()
    if kind == "bigint":
        return int(node[...].tobytes().decode("ascii"))
    return _PY_TYPES[kind](node[()])


# -- the first layout (dp-ckpt-plugin 0.1) ------------------------------------------


def _safe_v1(key: str) -> str:
    if key in ("", ".") or "/" in key or key.startswith("%"):
        return "%" + key.encode("utf-8").hex()
    return key
