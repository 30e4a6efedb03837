"""``dp --pt-expt freeze`` through ``on_resolve_restart`` and ``on_freeze``.

``-c`` may name a checkpoint directory (its pointer, alias or newest committed
checkpoint, for any ``save_ckpt`` name), a file or a prefix; the default is the
working directory, whose ``checkpoint`` pointer deepmd-kit and this plugin keep.
This module is also the built-in ``freeze`` plugin of the host: its
:func:`on_freeze` calls deepmd-kit's own pt_expt freeze.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...hookspecs import hookimpl
from ...layout import Family
from ...resolution import resolve_restart
from ..naming import primary_family_in
from ..settings import SUFFIX, restart_context

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
    spec = Path(flags.checkpoint_folder)
    family = Family("model.ckpt", SUFFIX)
    if spec.is_dir():
        family = primary_family_in(spec, SUFFIX, family)
    # a reader: leave the files of a possibly running job alone (no quarantine)
    context = restart_context(family, cwd=Path.cwd(), digest=True, quarantine=False)
    found = resolve_restart(pm, flags.checkpoint_folder, context)
    log.info("freezing %s (%s; checked: %s)", found.path, found.how, found.checked)
    options = {
        "host": HOST,
        "head": flags.head,
        "lower_kind": getattr(flags, "lower_kind", "nlist"),
    }
    return pm.hook.on_freeze(
        checkpoint=found.checkpoint, output=flags.output, options=options
    )
