"""An ``on_freeze`` implementation: export the arrays of an HDF5 checkpoint.

It answers only for checkpoints of the ``hdf5`` format and leaves every other
checkpoint to the next implementation by returning ``None``.
"""

from __future__ import annotations

import numpy as np

from dp_ckpt_plugin import hookimpl
from dp_ckpt_plugin.formats import hdf5


@hookimpl
def on_freeze(checkpoint, output, options):
    """Write the top-level arrays of ``checkpoint`` to ``output`` (``.npz``)."""
    if checkpoint.record is None or checkpoint.record.format != hdf5.NAME:
        return None
    state = hdf5.on_load_step(format=hdf5.NAME, path=checkpoint.path, file=None)
    arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
    with open(output, "wb") as handle:
        np.savez(handle, **arrays)
    return str(output)
