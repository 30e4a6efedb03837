"""Rule 23, generated: whatever ``save`` commits, ``restore`` reads back equal.

For every format, each value below is saved under the key ``v``. Either the
restored value is equal with the same types, dtypes and shapes at every level
(floats compared bit for bit, so ``-0.0`` and NaN count), or ``save`` raised a
``TypeError`` naming the key path before any file was created.
"""

from __future__ import annotations

import collections
import enum
import importlib.util
import math
import os
import struct

import numpy as np
import pytest

from dp_ckpt_plugin import CheckpointManager, get_plugin_manager

HAS_TORCH = importlib.util.find_spec("torch") is not None
FORMATS = [
    "hdf5",
    pytest.param(
        "torch", marks=pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
    ),
]

NUMPY_TYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.longdouble,
    np.complex64, np.complex128, np.clongdouble,
]  # fmt: skip
OTHER_DTYPES = ["M8[ns]", "M8[D]", "m8[s]", "U5", "S3", "V4", "O"]


def numpy_values():
    """Arrays and scalars of every dtype: shapes, byte orders, extremes."""
    out = {}
    for t in NUMPY_TYPES:
        dt = np.dtype(t)
        info = (
            np.finfo(dt)
            if dt.kind in "fc"
            else np.iinfo(dt)
            if dt.kind in "iu"
            else None
        )
        base = np.arange(6).astype(dt).reshape(2, 3)
        out[f"{dt.name}-array"] = base
        out[f"{dt.name}-0d"] = np.array(1, dtype=dt)
        out[f"{dt.name}-empty"] = np.zeros((2, 0, 3), dtype=dt)
        out[f"{dt.name}-strided"] = base[:, ::2]
        out[f"{dt.name}-scalar"] = dt.type(1)
        if dt.itemsize > 1:
            out[f"{dt.name}-bigendian"] = base.astype(dt.newbyteorder(">"))
        if info is not None:
            out[f"{dt.name}-extremes"] = np.array([info.min, info.max], dtype=dt)
        if dt.kind in "fc":
            out[f"{dt.name}-special"] = np.array([np.nan, -np.inf, -0.0], dtype=dt)
    for spec in OTHER_DTYPES:
        dt = np.dtype(spec)
        arr = (
            np.zeros(3, dtype=dt)
            if dt.kind != "O"
            else np.array([1, "a", None], dtype=object)
        )
        out[f"{dt.str}-array"] = arr
        out[f"{dt.str}-scalar"] = arr[0] if dt.kind != "O" else arr
    out["structured"] = np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])
    out["datetime-nat"] = np.datetime64("NaT")
    return out


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


class MyFloat(float):
    pass


class MyInt(int):
    pass


class MyBytes(bytes):
    pass


class MyList(list):
    pass


class MyDict(dict):
    pass


class MyF64(np.float64):
    pass


Point = collections.namedtuple("Point", "x y")


def python_values():
    """Plain values, extremes and subclasses of every supported type."""
    return {
        "true": True,
        "false": False,
        "zero": 0,
        "int64-max": 2**63 - 1,
        "int64-min": -(2**63),
        "int64-over": 2**63,
        "huge": 10**40,
        "huge-negative": -(10**40),
        "float": 0.1,
        "negative-zero": -0.0,
        "nan": math.nan,
        "inf": -math.inf,
        "tiny": 5e-324,
        "complex": complex(math.nan, -0.0),
        "empty-str": "",
        "unicode": "ünï ✓",
        "nul-in-str": "a\0b",
        "lone-surrogate": "\ud800",
        "empty-bytes": b"",
        "bytes": b"\0\xff",
        "none": None,
        "empty-list": [],
        "empty-tuple": (),
        "empty-dict": {},
        "nested": {"a": [1, (2.0, None)], "b": {"c": [b"x", "y"]}},
        "odd-keys": {"": 1, ".": 2, "/": 3, "a/b": 4, "%order": 5, "\0": 6, "..": 7},
        "np-float64": np.float64(0.1),
        "intenum": Color.RED,
        "str-subclass": MyStr("s"),
        "float-subclass": MyFloat(1.0),
        "int-subclass": MyInt(1),
        "bytes-subclass": MyBytes(b"b"),
        "list-subclass": MyList([1]),
        "dict-subclass": MyDict(a=1),
        "ordered-dict": collections.OrderedDict(a=1),
        "default-dict": collections.defaultdict(int, a=1),
        "namedtuple": Point(1, 2),
        "np-matrix": np.matrix([[1, 2]]),
        "masked": np.ma.masked_array([1, 2], mask=[0, 1]),
        "np-scalar-subclass": MyF64(1.0),
        "object": object(),
        "set": {1, 2},
    }


def torch_values():
    if not HAS_TORCH:
        return {}
    import torch

    out = {}
    for dt in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
        torch.int64, torch.uint8, torch.bool, torch.complex64,
    ):  # fmt: skip
        out[f"tensor-{dt}"] = torch.arange(6).to(dt).reshape(2, 3)
        out[f"tensor-{dt}-0d"] = torch.tensor(1).to(dt)
        out[f"tensor-{dt}-empty"] = torch.zeros((0, 3), dtype=dt)
    out["parameter"] = torch.nn.Parameter(torch.ones(2))
    out["size"] = torch.Size([2, 3])
    out["dtype"] = torch.float32
    out["device"] = torch.device("cpu")
    out["state-dict"] = collections.OrderedDict(w=torch.ones(2), b=torch.zeros(1))
    return out


VALUES = {**numpy_values(), **python_values()}


#: x87's 80-bit extended float, stored in 16 bytes of which 10 hold the value.
_EXTENDED = (
    np.finfo(np.longdouble).nmant == 63 and np.dtype(np.longdouble).itemsize == 16
)


def _value_bytes(x) -> bytes:
    """The bytes of ``x``'s values; an 80-bit extended float's 6 bytes of
    padding are left out (they hold whatever the memory held, so two equal
    values need not share them)."""
    raw = np.ascontiguousarray(x)
    if _EXTENDED and raw.dtype.type in (np.longdouble, np.clongdouble):
        return raw.view(np.uint8).reshape(-1, 16)[:, :10].tobytes()
    return raw.tobytes()


def same(a, b) -> bool:
    """Equal with identical types at every level; floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
            and (
                not isinstance(a, collections.defaultdict)
                or a.default_factory is b.default_factory
            )
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (np.ndarray, np.generic)):
        if a.dtype != b.dtype or np.shape(a) != np.shape(b):
            return False
        if a.dtype.kind == "O":
            pairs = zip(np.ravel(a), np.ravel(b), strict=True)
            return all(same(x, y) for x, y in pairs)
        return _value_bytes(a) == _value_bytes(b)
    if HAS_TORCH:
        import torch

        if isinstance(a, torch.Tensor):
            return (
                a.dtype == b.dtype
                and a.shape == b.shape
                and a.requires_grad == b.requires_grad
                and torch.equal(a.detach(), b.detach())
            )
    return a == b


def cases(fmt):
    values = dict(VALUES)
    if fmt == "torch":
        values.update(torch_values())
    return sorted(values.items())


def run_case(tmp_path, fmt, value):
    directory = tmp_path / "models"
    pm = get_plugin_manager(entry_points=False)
    with CheckpointManager(directory, format=fmt, pm=pm, max_keep=0) as m:
        try:
            m.save(1, {"v": value})
        except TypeError as exc:
            assert "/v" in str(exc), f"the error does not name the key path: {exc}"
            assert not directory.exists(), os.listdir(directory)
            return "refused"
        restored = m.restore("latest").state
    assert list(restored) == ["v"]
    assert same(value, restored["v"]), (value, restored["v"])
    return "exact"


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_value_round_trips_exactly_or_is_refused(tmp_path, fmt):
    outcome = {}
    for index, (name, value) in enumerate(cases(fmt)):
        outcome[name] = run_case(tmp_path / str(index), fmt, value)
    refused = sorted(n for n, o in outcome.items() if o == "refused")
    exact = sorted(n for n, o in outcome.items() if o == "exact")
    print(
        f"\n{fmt}: {len(exact)} values round-trip exactly, {len(refused)} refused: {refused}"
    )
    # what each format must store: every plain numeric numpy dtype and Python scalar
    must = [n for n in outcome if n.endswith(("-array", "-0d", "-empty", "-strided"))]
    must = [
        n for n in must if n.split("-")[0] in {np.dtype(t).name for t in NUMPY_TYPES}
    ]
    must += ["true", "zero", "huge", "float", "negative-zero", "nan", "complex"]
    must += ["empty-str", "unicode", "empty-bytes", "none", "nested", "np-float64"]
    assert not set(must) & set(refused), set(must) & set(refused)
    # subclasses that would come back as their base type are refused, not changed
    for name in ("intenum", "str-subclass", "float-subclass", "list-subclass",
                 "dict-subclass", "np-matrix", "masked", "np-scalar-subclass",
                 "object", "namedtuple"):  # fmt: skip
        assert outcome[name] == "refused", name
