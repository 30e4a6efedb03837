"""What the tests build and check, in one place.

Payloads
    :func:`make_payload` gives the payload of a step, for the ``hdf5`` format
    (NumPy arrays) or the ``torch`` format (tensors); :func:`payload_mismatches`
    says how a payload read back differs from it. :func:`make_arrays` is its
    arrays alone, for formats that take nothing else. :func:`nested_payload`
    and :func:`assert_same` are the nested structures of the conformance suite.
Managers and stores
    :func:`open_manager` and :func:`make_store` build them on a plugin manager
    without third-party entry points (:func:`plugin_manager`);
    :func:`fill_store` commits a few steps and closes.
Looking at a directory
    :data:`SUFFIX`, :func:`family`, :func:`is_temp`, :func:`temporaries`,
    :func:`committed_paths` and :func:`committed_steps`.
The torch format
    :data:`HAS_TORCH`, :data:`needs_torch`, :func:`backend_case` and
    :data:`BACKENDS`: torch cases skip cleanly where torch is not installed.
Processes
    :data:`SAVER_CHILD` and :func:`start_saver` run the checkpoint writer that
    tests kill; :func:`free_port` finds a port for a process group.

``saver_child.py`` imports this module too: it runs as a script from this
directory, so ``import helpers`` finds it there.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dp_ckpt_plugin import (
    CheckpointManager,
    CheckpointStore,
    FamilyConfig,
    get_plugin_manager,
)
from dp_ckpt_plugin.checkpoint.catalogue import committed
from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.deepmd.naming import ema_family
from dp_ckpt_plugin.retention import KeepLast
from dp_ckpt_plugin.storage.temp import temp_target
from dp_ckpt_plugin.store.publish import Mirror

# -- the torch format ---------------------------------------------------------

#: Whether torch can be imported here; torch-only cases skip without it.
HAS_TORCH = importlib.util.find_spec("torch") is not None
#: Marks a test or a parameter that needs torch.
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def backend_case(backend, *values):
    """Return a parameter set starting with ``backend``, skipped without torch.

    Parameters
    ----------
    backend : str
        ``"hdf5"`` or ``"torch"``.
    *values
        The other values of the parameter set.

    Returns
    -------
    ParameterSet
        Its id is the one plain values give (``torch-write``, ``hdf5``, ...).
    """
    marks = [needs_torch] if backend == "torch" else []
    return pytest.param(backend, *values, marks=marks)


#: The built-in formats, as parameters: ``torch`` skips without torch.
BACKENDS = [backend_case("hdf5"), backend_case("torch")]
#: The file suffix of each built-in format.
SUFFIX = {"hdf5": ".h5", "torch": ".pt"}

# -- payloads -----------------------------------------------------------------

#: Elements of the three arrays (float64, float32, int64): 24 MB in all.
FULL_SIZES = (1_500_000, 1_000_000, 1_000_000)
#: Elements of the three arrays of a small payload (the default).
SMALL_SIZES = (64, 64, 64)


def make_arrays(step, sizes=SMALL_SIZES):
    """Return the NumPy arrays of the payload of ``step``.

    Parameters
    ----------
    step : int
        Seeds the content.
    sizes : tuple of int
        Elements of the three arrays.

    Returns
    -------
    dict
        ``weights`` (float64), ``moments`` (float32) and ``indices`` (int64).
    """
    rng = np.random.default_rng(step)
    return {
        "weights": rng.random(sizes[0]),
        "moments": rng.random(sizes[1], dtype=np.float32),
        "indices": rng.integers(0, 1 << 40, sizes[2]),
    }


def make_payload(step, backend="hdf5", sizes=SMALL_SIZES):
    """Return the payload of ``step``: the same content on every call.

    Parameters
    ----------
    step : int
        Seeds the content.
    backend : str
        ``"torch"`` gives tensors, anything else NumPy arrays.
    sizes : tuple of int
        Elements of the three arrays (:func:`make_arrays`).

    Returns
    -------
    dict
        The arrays of :func:`make_arrays`, ``step`` (int) and ``tag``
        (``"step-<step>"``).
    """
    arrays = make_arrays(step, sizes)
    if backend == "torch":
        import torch

        arrays = {key: torch.from_numpy(value) for key, value in arrays.items()}
    return {**arrays, "step": int(step), "tag": f"step-{step}"}


def payload_mismatches(state, step, backend="hdf5", sizes=SMALL_SIZES):
    """Say how ``state`` differs from the payload of ``step``.

    Parameters
    ----------
    state : dict
        A payload read back.
    step, backend, sizes
        As for :func:`make_payload`.

    Returns
    -------
    list of str
        One entry per key that differs; empty when the content is exact
        (same keys, values, dtypes).
    """
    expected = make_payload(step, "hdf5", sizes)
    if not isinstance(state, dict) or sorted(state) != sorted(expected):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        return [f"keys {keys} instead of {sorted(expected)}"]
    bad = []
    if int(state["step"]) != step:
        bad.append(f"step {state['step']} instead of {step}")
    if state["tag"] != expected["tag"]:
        bad.append(f"tag {state['tag']!r} instead of {expected['tag']!r}")
    for key, want in make_arrays(step, sizes).items():
        got = state[key].numpy() if backend == "torch" else np.asarray(state[key])
        if got.dtype != want.dtype or not np.array_equal(got, want):
            bad.append(f"{key} differs")
    return bad


def nested_payload(step, backend="hdf5"):
    """Return a nested payload of ``step``, shaped like a trainer's.

    The conformance suite's: 2-D, 1-D and empty arrays of three dtypes in a
    ``model`` mapping, beside scalars, strings, ``None``, booleans and lists.
    For ``torch`` the arrays are tensors and an optimizer state is added.
    """
    rng = np.random.default_rng(step)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i64": np.arange(step, step + 4, dtype=np.int64),
        "empty": np.zeros((0, 2)),
    }
    if backend == "torch":
        import torch

        return {
            "model": {k: torch.from_numpy(v.copy()) for k, v in arrays.items()},
            "optimizer": {
                "state": {},
                "param_groups": [{"lr": 0.001, "params": [0, 1]}],
            },
            "train_infos": {"step": step, "lr": 1e-3},
        }
    return {
        "model": arrays,
        "train_infos": {"step": step, "lr": 1e-3, "note": "hi", "flags": [True, None]},
    }


def assert_same(a, b):
    """Assert that two nested payloads are equal: keys, types, dtypes, shapes, values."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif hasattr(a, "detach"):  # a tensor (a Parameter stays one)
        assert type(a) is type(b) and a.requires_grad == b.requires_grad
        assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
        assert a.detach().equal(b.detach())
    elif hasattr(a, "dtype") and hasattr(a, "shape"):
        assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
        assert type(a) is type(b) and a == b


# -- managers and stores ------------------------------------------------------


def plugin_manager(*plugins):
    """Return a fresh plugin manager without third-party entry points.

    Parameters
    ----------
    *plugins
        Registered on top of the built-ins.
    """
    return get_plugin_manager(entry_points=False, extra=plugins)


def open_manager(directory, backend="hdf5", *, pm=None, plugins=(), **kwargs):
    """Return a :class:`CheckpointManager` on ``directory``.

    Parameters
    ----------
    directory : Path
        The checkpoint directory.
    backend : str
        The format it writes.
    pm : pluggy.PluginManager, optional
        Its plugin manager; by default :func:`plugin_manager` of ``plugins``.
    plugins : sequence
        Registered on the default plugin manager (not with ``pm``).
    **kwargs
        Passed on (``max_keep``, ``verify``, ``prefix``...); what is not given
        keeps :class:`CheckpointManager`'s default.
    """
    if pm is None:
        pm = plugin_manager(*plugins)
    elif plugins:
        raise TypeError("give either pm or plugins")
    return CheckpointManager(directory, format=backend, pm=pm, **kwargs)


def make_store(pm, directory, *, keep=2, ema_keep=None, compat=None, backend="hdf5"):
    """Return a :class:`CheckpointStore` of ``model.ckpt`` and its EMA family.

    Parameters
    ----------
    pm : pluggy.PluginManager
        Its plugin manager.
    directory : Path
        The checkpoint directory.
    keep : int
        Retention window of ``model.ckpt``.
    ema_keep : int, optional
        Retention window of the EMA family; ``keep`` by default.
    compat : dict, optional
        ``{"pointer": path, "alias": path}``: mirrors of ``model.ckpt``
        published outside the directory.
    backend : str
        The format it writes.
    """
    fam = family(backend)
    mirrors = tuple(Mirror(path, kind) for kind, path in (compat or {}).items())
    configs = [FamilyConfig(fam, KeepLast(keep), mirrors=mirrors)]
    configs.append(
        FamilyConfig(ema_family(fam), KeepLast(keep if ema_keep is None else ema_keep))
    )
    return CheckpointStore(directory, format=backend, pm=pm, families=configs)


def fill_store(directory, steps, backend="hdf5", **kwargs):
    """Commit the payload of each of ``steps`` in ``directory``, keeping all.

    Parameters
    ----------
    directory : Path
        The checkpoint directory.
    steps : iterable of int
        Saved in this order.
    backend : str
        The format.
    **kwargs
        Passed on to :func:`open_manager` (``prefix``...).
    """
    with open_manager(directory, backend, max_keep=0, **kwargs) as manager:
        for step in steps:
            manager.save(step, make_payload(step, backend))


# -- looking at a directory ---------------------------------------------------


def family(backend="hdf5", prefix="model.ckpt"):
    """Return the family ``<prefix>-<step><suffix>`` of ``backend``."""
    return Family(prefix, SUFFIX[backend])


def is_temp(name: str) -> bool:
    """Whether a file name has exactly the form of the storage's temporary names."""
    return temp_target(name) is not None


def temporaries(directory):
    """Return the sorted names of the temporary files in ``directory``."""
    return sorted(name for name in os.listdir(directory) if is_temp(name))


def committed_paths(directory, backend="hdf5", prefix="model.ckpt"):
    """Map the step of each committed checkpoint in ``directory`` to its path.

    Steps come in increasing order.
    """
    return {c.step: c.path for c in committed(directory, family(backend, prefix))}


def committed_steps(directory, backend="hdf5", prefix="model.ckpt"):
    """Return the steps of the committed checkpoints in ``directory``, increasing."""
    return list(committed_paths(directory, backend, prefix))


# -- processes ----------------------------------------------------------------

#: The checkpoint writer tests run as a child process (and kill).
SAVER_CHILD = Path(__file__).with_name("saver_child.py")


def start_saver(*args, **popen):
    """Start ``python saver_child.py <args>``; return the process.

    Its stdout is a text pipe of event lines (see ``saver_child.py``).

    Parameters
    ----------
    *args : str or path
        The mode and its arguments.
    **popen
        More :class:`subprocess.Popen` arguments (``stdin``, ``stderr``).
    """
    return subprocess.Popen(
        [sys.executable, str(SAVER_CHILD), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=SAVER_CHILD.parent,
        **popen,
    )


#: Lowest port :func:`free_port` hands out.
_LOWEST_PORT = 20000
#: Ports already handed out by this process (a server stopped and started
#: again keeps its port; no other caller gets it meanwhile).
_GIVEN_PORTS: set[int] = set()
#: Its own generator: a test seeding :mod:`random` does not fix the ports.
_PORT_DRAW = random.Random()


def _ephemeral_start() -> int:
    """The lowest port the kernel picks by itself (for port 0 or a connection)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """Return a TCP port on localhost that was free a moment ago.

    The port is below the kernel's ephemeral range, so no socket the kernel
    numbers itself (a connection's own end, a server bound to port 0) takes
    it between this call and its use; under pytest-xdist each worker draws
    from a slice of its own, so two workers never get the same port. Where
    there is no room below that range, the kernel picks.
    """
    top = _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    width = (top - _LOWEST_PORT) // count
    if width >= 100:
        low = _LOWEST_PORT + (index % count) * width
        for _ in range(200):
            port = _PORT_DRAW.randrange(low, low + width)
            if port in _GIVEN_PORTS:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _GIVEN_PORTS.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _GIVEN_PORTS.add(port)
    return port


# -- remote stores ---------------------------------------------------------------


def remote_store(
    pm, staging, storage, *, keep=2, ttl=60.0, upload_wait=30.0, holder=None, **kwargs
):
    """A store staged in ``staging`` for the remote store on ``storage`` (hdf5).

    Returns the :class:`CheckpointStore`; its ``remote`` is the
    :class:`~dp_ckpt_plugin.remote.replica.RemoteStore`.
    """
    from dp_ckpt_plugin.remote.replica import RemoteStore

    remote = RemoteStore(
        storage, format="hdf5", ttl=ttl, upload_wait=upload_wait, holder=holder
    )
    return CheckpointStore(
        staging,
        format="hdf5",
        pm=pm,
        families=[FamilyConfig(family(), KeepLast(keep))],
        remote=remote,
        **kwargs,
    )


def gone_holder():
    """A lease holder on this host whose process has ended (a run that was killed)."""
    import time

    from dp_ckpt_plugin.remote.lease import Holder

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return Holder(socket.gethostname(), child.pid, "dp train (killed)", time.ctime())


# -- damaging a file by its own structure -------------------------------------------


def zip_member_spans(data: bytes) -> list[tuple[str, int, int]]:
    """``(name, start, size)`` of the stored bytes of each member of a zip archive.

    Read from each member's local header (its own name and extra lengths), so
    a byte flipped in ``data[start:start + size]`` lies inside that member's
    data, not in a header.
    """
    import io
    import struct
    import zipfile

    spans = []
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            at = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[at + 26 : at + 30])
            spans.append(
                (info.filename, at + 30 + name_len + extra_len, info.compress_size)
            )
    return spans


def flipped(data: bytes, at: int) -> bytes:
    """``data`` with every bit of the byte at ``at`` inverted."""
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def open_fd_targets() -> collections.Counter:
    """What this process's open descriptors name (``/proc/self/fd``), counted."""
    listing = f"/proc/{os.getpid()}/fd"
    found = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        if target != listing:
            found[target] += 1
    return found
