"""A serialization format: flat dicts of NumPy arrays in ``.npz`` files.

It declares itself with ``register_formats`` and writes and reads bytes with
``on_save_step`` and ``on_load_step``. Names, commit records, pointers and
retention are the store's business: the format never sees a final path when
writing, only an open temporary file, and reads the verified bytes it is
handed.
"""

from __future__ import annotations

import numpy as np

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.formats import FormatInfo

NAME = "npz"


@hookimpl
def register_formats():
    """Declare the ``npz`` format and its suffix."""
    return [FormatInfo(NAME, ".npz", "flat dict of arrays, numpy.savez")]


@hookimpl
def on_save_step(format, step, state, file):
    """Write ``state`` (a dict of arrays) into the open file."""
    if format != NAME:
        return None
    np.savez(file, **state)
    return True


@hookimpl
def on_load_step(format, path, file):
    """Read a checkpoint this format wrote, from its verified bytes in ``file``."""
    if format != NAME:
        return None
    with np.load(file if file is not None else path) as data:
        return {key: data[key] for key in data.files}
