"""A serialization backend: flat dicts of NumPy arrays in ``.npz`` files.

It declares itself with ``register_backends`` and writes and reads bytes with
``on_save_step`` and ``on_load_step``. Names, commit records, pointers and
retention are the store's business: the backend never sees a final path when
writing, only an open temporary file.
"""

from __future__ import annotations

import numpy as np

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.backends import BackendInfo

NAME = "npz"


@hookimpl
def register_backends():
    """Declare the ``npz`` backend and its suffix."""
    return [BackendInfo(NAME, ".npz", "flat dict of arrays, numpy.savez")]


@hookimpl
def on_save_step(backend, step, state, file):
    """Write ``state`` (a dict of arrays) into the open file."""
    if backend != NAME:
        return None
    np.savez(file, **state)
    return True


@hookimpl
def on_load_step(backend, path):
    """Read a checkpoint this backend wrote."""
    if backend != NAME:
        return None
    with np.load(path) as data:
        return {key: data[key] for key in data.files}
