"""The freezer of the ``dp --pt-expt`` host: deepmd-kit's pt_expt ``freeze``.

This module is the host's built-in ``freeze`` plugin: :func:`on_freeze`
freezes a resolved checkpoint (a ``.pte``). Resolving ``-c`` (``latest``, a
directory, a file, a prefix) is shared: :func:`dp_ckpt_plugin.deepmd.cli.run_freeze`.
"""

from __future__ import annotations

from ...markers import hookimpl
from . import DESCRIPTOR

#: The name ``on_freeze`` implementations see in ``options["host"]``.
HOST = DESCRIPTOR.name


@hookimpl(trylast=True)
def on_freeze(checkpoint, output, options):
    """Freeze a pt_expt training checkpoint with deepmd-kit's ``freeze``."""
    if options.get("host", HOST) != HOST:
        return None
    from deepmd.pt_expt.entrypoints.main import freeze

    freeze(
        model=str(checkpoint.path),
        output=output,
        head=options.get("head"),
        lower_kind=options.get("lower_kind", "nlist"),
    )
    return output


def freeze_options(flags) -> dict:
    """What ``on_freeze`` needs from ``dp --pt-expt freeze``'s flags."""
    return {"head": flags.head, "lower_kind": getattr(flags, "lower_kind", "nlist")}
