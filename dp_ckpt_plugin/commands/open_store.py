"""Which :class:`~dp_ckpt_plugin.commands.views.StoreView` a command-line value names.

A URL of object storage is a store read through its HEAD
(``head_view``); anything else is a store directory (``directory_view``).
"""

from __future__ import annotations

from pathlib import Path

from . import is_remote
from .directory_view import DirectoryView
from .views import StoreView


def open_view(value: Path | str) -> StoreView:
    """The view of the store a command-line value names (a directory or a URL)."""
    if is_remote(value):
        from ..objectstore.registry import storage_for
        from .head_view import HeadView  # object storage's libraries only when asked

        return HeadView(storage_for(str(value)))
    return DirectoryView(Path(value))


def locate(value: Path | str) -> tuple[StoreView, str]:
    """The store holding the checkpoint ``value`` names, and its name in it.

    A URL is looked up for a HEAD at it or above it; a path is a file of the
    directory it lies in.
    """
    if is_remote(value):
        from ..remote.resolver import store_above
        from .head_view import HeadView

        storage, rest = store_above(str(value))
        return HeadView(storage), rest
    path = Path(value).absolute()
    return DirectoryView(path.parent), path.name
