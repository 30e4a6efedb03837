"""The built-in behaviour, registered as ordinary plugins.

Each object here is registered under its own name (``publish``, ``prune``,
``resolve``), so ``DP_CKPT_DISABLE_PLUGINS=prune`` turns retention off and a
third-party plugin can answer ``on_resolve_restart`` before the built-in one.
"""

from __future__ import annotations

import logging

from .hookspecs import hookimpl
from .resolve import resolve

log = logging.getLogger("dp_ckpt_plugin")


class Publish:
    """Move the latest pointer and alias to each new checkpoint, first."""

    @hookimpl(tryfirst=True)
    def on_commit(self, store, checkpoint):
        store.publish(checkpoint)
        log.info("committed %s (step %d)", checkpoint.path, checkpoint.step)


class Prune:
    """Apply retention after everything else has seen the new checkpoint."""

    @hookimpl(trylast=True)
    def on_commit(self, store, checkpoint):
        for path in store.prune(checkpoint):
            log.info("removed %s (retention)", path)


class Resolve:
    """Resolve restart specifications by the rules of :mod:`dp_ckpt_plugin.resolve`."""

    @hookimpl(trylast=True)
    def on_resolve_restart(self, spec, context):
        return resolve(spec, context)


#: Built-in plugins by the name they are registered (and blocked) under.
BUILTINS = {
    "publish": Publish,
    "prune": Prune,
    "resolve": Resolve,
}
