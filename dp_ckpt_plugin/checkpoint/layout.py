"""File names of a checkpoint store: numbered files, aliases, pointers, records.

Nothing here touches the filesystem. The names are chosen so that no glob of
numbered checkpoints (``<prefix>-*<suffix>``) or of aliases
(``<prefix><suffix>``, ``<prefix>.*``) can match a temporary file or a commit
record: both start with a dot.

A numbered name is taken apart in one place, :func:`parse_numbered`: a
family's :meth:`Family.step_of`, resolution and the ``dp-ckpt`` commands all
read names through it.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass
from typing import NamedTuple

from .limits import MAX_STEP

#: Default name of a family's latest pointer file.
POINTER_NAME = "checkpoint"
#: Folder inside a store where corrupt checkpoints are moved aside.
QUARANTINE_DIR = "quarantine"
#: Folder inside a store where earlier runs are moved.
ARCHIVE_DIR = "archive"
#: Name of the single-writer lock file of a store.
LOCK_NAME = ".dp_ckpt.lock"
#: Name of the file describing the holder of the lock.
HOLDER_NAME = ".dp_ckpt.holder.json"
#: Name of the file in which a store describes its families and policies.
MANIFEST_NAME = ".dp_ckpt.store.json"

_RECORD_SUFFIX = ".commit.json"
_STEP_RE = re.compile(r"0|[1-9][0-9]*")


@dataclass(frozen=True)
class Family:
    """One series of numbered checkpoints sharing a prefix.

    Parameters
    ----------
    prefix : str
        File-name prefix, such as ``model.ckpt``. It must be a bare file name.
    suffix : str
        Format suffix including the dot, such as ``.pt`` or ``.h5``.
    pointer : str
        File name of the family's latest pointer inside the store directory.
    """

    prefix: str
    suffix: str
    pointer: str = POINTER_NAME

    def __post_init__(self) -> None:
        if not self.prefix or os.sep in self.prefix or self.prefix in {".", ".."}:
            raise ValueError(
                f"a family prefix must be a bare file name, got {self.prefix!r}"
            )
        if not self.suffix.startswith("."):
            raise ValueError(f"a suffix must start with a dot, got {self.suffix!r}")

    @property
    def alias(self) -> str:
        """File name of the latest alias, such as ``model.ckpt.pt``."""
        return f"{self.prefix}{self.suffix}"

    def numbered(self, step: int) -> str:
        """Return the file name of the checkpoint of ``step``."""
        if step < 0:
            raise ValueError(f"a step must not be negative, got {step}")
        return f"{self.prefix}-{int(step)}{self.suffix}"

    def step_of(self, name: str) -> int | None:
        """Return the step a file name encodes, or ``None`` if it is not ours.

        Only names this family writes count: ``<prefix>-<step><suffix>`` with a
        step in canonical decimal form (no sign, no leading zeros).
        """
        found = parse_numbered(name, self.suffix)
        return found.step if found is not None and found.prefix == self.prefix else None


class NumberedName(NamedTuple):
    """A numbered checkpoint name, ``<prefix>-<step><suffix>``, taken apart."""

    prefix: str
    step: int
    suffix: str


def parse_numbered(name: str, suffix: str | None = None) -> NumberedName | None:
    """Take a numbered checkpoint name apart, or return ``None``.

    ``<prefix>-<step><suffix>`` with a prefix that is not empty and a step in
    canonical decimal form (no sign, no leading zeros). The suffix is
    ``suffix`` when given (the name must end with it), else the name's last
    dot-part (``.pt`` of ``model.ckpt-20.pt``).
    """
    if suffix is None:
        dot = name.rfind(".")
        if dot < 0 or dot == len(name) - 1:
            return None
        suffix = name[dot:]
    elif not suffix or not name.endswith(suffix):
        return None
    prefix, dash, text = name[: len(name) - len(suffix)].rpartition("-")
    if not (prefix and dash and _STEP_RE.fullmatch(text)):
        return None
    return NumberedName(prefix, int(text), suffix)


def step_in_name(name: str, suffix: str | None = None) -> int | None:
    """The step a numbered name of any prefix encodes (``suffix`` first), or ``None``.

    For a file without a commit record: its step as its name says.
    """
    found = (suffix and parse_numbered(name, suffix)) or parse_numbered(name)
    return found.step if found else None


def record_name(checkpoint_name: str) -> str:
    """Return the file name of a checkpoint's commit record."""
    return f".{checkpoint_name}{_RECORD_SUFFIX}"


def record_target(name: str) -> str | None:
    """Return the checkpoint a commit record's file name describes, or ``None``."""
    if name.startswith(".") and name.endswith(_RECORD_SUFFIX):
        return name[1 : -len(_RECORD_SUFFIX)] or None
    return None


def check_step(step: object) -> int:
    """Return ``step`` as an int; refuse a bool, a float or a negative number."""
    if isinstance(step, bool):
        raise TypeError(f"a step is an int, got the bool {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(
            f"a step is an int, got {type(step).__name__} {step!r}"
        ) from None
    if value < 0:
        raise ValueError(f"a step must not be negative, got {value}")
    if value > MAX_STEP:
        raise ValueError(f"a step must not be above 2**63 - 1, got {value}")
    return value
