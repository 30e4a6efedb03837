"""How a store treats one family: its names, retention policy and mirrors."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..checkpoint.layout import Family
from ..retention import KeepLast, RetentionPolicy, as_policy
from .publish import Mirror


@dataclass
class FamilyConfig:
    """How a store treats one family.

    Attributes
    ----------
    family : Family
        Names of the family.
    policy : RetentionPolicy
        Which committed checkpoints to keep (an object with ``keeps`` alone
        is adapted, :func:`~dp_ckpt_plugin.retention.as_policy`, when set).
    mirrors : tuple of Mirror
        Pointers and aliases outside the store to keep up to date too (a
        host's compatibility files), each holding a path relative to its own
        directory. Pointer mirrors are also where ``latest`` looks when the
        store itself names nothing.
    """

    family: Family
    policy: RetentionPolicy = field(default_factory=lambda: KeepLast(5))
    mirrors: tuple[Mirror, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        if name == "policy":
            value = as_policy(value)
        super().__setattr__(name, value)
