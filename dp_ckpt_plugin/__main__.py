"""``python -m dp_ckpt_plugin``: the ``dp-ckpt`` command."""

from .commands import entry_point

entry_point()
