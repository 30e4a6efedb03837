"""Serialization formats.

A format only turns a payload into bytes in an open file and back
(:func:`~dp_ckpt_plugin.hookspecs.on_save_step`,
:func:`~dp_ckpt_plugin.hookspecs.on_load_step`): the storage opens every file
it reads or writes, a format never opens a path. Names, commit, publication
and retention belong to the store. Formats declare themselves through
:func:`~dp_ckpt_plugin.hookspecs.register_formats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..storage import default_storage


@dataclass(frozen=True)
class FormatInfo:
    """A serialization format as the store knows it.

    Attributes
    ----------
    name : str
        The name users pass as ``format=``.
    suffix : str
        File suffix of its checkpoints, with the dot.
    description : str
        One line for listings and errors.
    check : callable or None
        Called with a payload before anything is written; raises
        :class:`TypeError` naming the key path of a value the format cannot
        read back exactly (rule 23). ``None`` when the format checks nothing.
    """

    name: str
    suffix: str
    description: str = ""
    check: Callable[[Any], None] | None = None


def reading(path: Path, file: BinaryIO | None) -> BinaryIO:
    """What ``on_load_step`` reads: ``file``, else ``path`` read once by the storage."""
    if file is not None:
        return file
    return default_storage().read_payload(Path(path)).reader()
