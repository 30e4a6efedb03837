"""``dp --pt-expt freeze`` through ``on_resolve_restart`` and ``on_freeze``.

``-c`` may name a checkpoint directory (its pointer, alias or newest committed
checkpoint, for any ``save_ckpt`` name), a file or a prefix; the default is the
working directory, whose ``checkpoint`` pointer deepmd-kit and this plugin keep.
The built-in :class:`FreezePTExpt` plugin then calls deepmd-kit's own freeze.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..hookspecs import hookimpl
from ..layout import Family
from ..resolve import ResolveContext, primary_family_in
from ..store import resolve_with_hooks

log = logging.getLogger("dp_ckpt_plugin")


class FreezePTExpt:
    """Freeze a pt_expt training checkpoint with deepmd-kit's ``freeze``."""

    @hookimpl(trylast=True)
    def on_freeze(self, checkpoint, output, options):
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
    family = Family("model.ckpt", ".pt")
    if spec.is_dir():
        family = primary_family_in(spec, ".pt", family)
    context = ResolveContext(
        family=family,
        cwd=Path.cwd(),
        sha256=True,
        quarantine=False,  # a reader: leave the files of a possibly running job alone
    )
    found = resolve_with_hooks(pm, flags.checkpoint_folder, context)
    log.info("freezing %s (%s; checked: %s)", found.path, found.how, found.checked)
    options = {"head": flags.head, "lower_kind": getattr(flags, "lower_kind", "nlist")}
    return pm.hook.on_freeze(checkpoint=found, output=flags.output, options=options)
