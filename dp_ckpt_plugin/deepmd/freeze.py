"""``dp --pt-expt freeze`` through ``on_resolve_restart`` and ``on_freeze``.

``-c`` may name a checkpoint directory (its pointer, alias or newest committed
checkpoint, for any ``save_ckpt`` name), a file or a prefix; the default is the
working directory, whose ``checkpoint`` pointer deepmd-kit and this plugin keep.
The built-in :class:`FreezePTExpt` plugin then calls deepmd-kit's own freeze.
"""

from __future__ import annotations

from pathlib import Path

from ..hookspecs import hookimpl
from ..layout import Family
from ..resolve import ResolveContext
from ..store import resolve_with_hooks


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
    context = ResolveContext(
        family=Family("model.ckpt", ".pt"),
        cwd=Path.cwd(),
        sha256=True,
        quarantine=False,  # a reader: leave the files of a possibly running job alone
    )
    found = resolve_with_hooks(pm, flags.checkpoint_folder, context)
    options = {"head": flags.head, "lower_kind": getattr(flags, "lower_kind", "nlist")}
    return pm.hook.on_freeze(checkpoint=found, output=flags.output, options=options)
