"""``dp --pt-expt freeze`` through ``on_resolve_restart`` and ``on_freeze``.

``-c`` may name a checkpoint directory (its pointer, alias or newest committed
checkpoint, for any ``save_ckpt`` name), a file or a prefix; the default is the
working directory, whose ``checkpoint`` pointer deepmd-kit and this plugin keep.
This module is also the built-in ``freeze`` plugin of the host: its
:func:`on_freeze` calls deepmd-kit's own pt_expt freeze.
"""

from __future__ import annotations

import logging

from ...hookspecs import hookimpl
from ..logs import describe_checked, describe_how, shown
from ..settings import resolve_for_reading

log = logging.getLogger("dp_ckpt_plugin")

#: The name ``on_freeze`` implementations see in ``options["host"]``.
HOST = "pt_expt"


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


def run_freeze(flags, pm) -> str:
    """Resolve ``flags.checkpoint_folder`` and freeze it; return the output."""
    found = resolve_for_reading(pm, flags.checkpoint_folder)
    log.info(
        "freezing %s, %s; %s",
        shown(found.path),
        describe_how(found.how),
        describe_checked(found.checked),
    )
    options = {
        "host": HOST,
        "head": flags.head,
        "lower_kind": getattr(flags, "lower_kind", "nlist"),
    }
    return pm.hook.on_freeze(
        checkpoint=found.checkpoint, output=flags.output, options=options
    )
