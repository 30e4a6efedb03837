"""deepmd-kit's checkpoint names: the EMA family and the prefix of a store.

deepmd-kit 3.2 saves an EMA series beside the periodic one, naming it by
inserting ``_ema`` before the last suffix of ``save_ckpt``, and points at it
with its own pointer file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePath

from ..checkpoint.catalogue import recorded_families
from ..checkpoint.layout import POINTER_NAME, Family


def ema_prefix(prefix: str) -> str:
    """Return the EMA family's prefix, as deepmd-kit derives it.

    ``_ema`` goes before the last suffix: ``model.ckpt`` becomes
    ``model_ema.ckpt`` and ``run`` becomes ``run_ema``.
    """
    path = PurePath(prefix)
    return f"{path.stem}_ema{path.suffix}"  # no suffix: the stem is the name


def ema_family(family: Family) -> Family:
    """Return the EMA family that goes with the periodic ``family``."""
    prefix = ema_prefix(family.prefix)
    return Family(prefix, family.suffix, f"{POINTER_NAME}.{prefix}")


def primary_family_in(directory: Path, suffix: str, default: Family) -> Family:
    """Guess the periodic family of a store from its commit records.

    Used where no training input says what ``save_ckpt`` was (``dp freeze -c
    D``). The families recorded in ``directory`` that are not the EMA family of
    another recorded one are candidates; if there is exactly one, it is the
    answer, otherwise ``default``.
    """
    families = recorded_families(directory, suffix)
    primaries = [f for f in families if not any(ema_prefix(g) == f for g in families)]
    if len(primaries) == 1:
        with contextlib.suppress(ValueError):
            return Family(primaries[0], suffix)
    return default
