"""The store's description of itself: its format, families and policies.

A store writes ``D/.dp_ckpt.store.json`` on its first save of a run, and
again whenever what it says changes: the format, and for each family (the
primary one first) its prefix, suffix, pointer and retention policy, as the
plain keys of :func:`~dp_ckpt_plugin.retention.policy_from_dict`. Readers
that have no training input at hand (the ``dp-ckpt`` command, the ``best``
resolver) learn from it which families the directory holds and which policy
keeps each file. It describes; it decides nothing: a store without it (written
by plain deepmd-kit or an older plugin) is still read, with families found
from the commit records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidRecordError
from .fsio import write_text_atomic
from .layout import MANIFEST_NAME, Family
from .retention import RetentionPolicy, policy_from_dict, policy_to_dict, reason_of

#: Version of the manifest format this package writes and reads.
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class FamilyInfo:
    """One family as the manifest describes it.

    Attributes
    ----------
    family : Family
        Its prefix, suffix and pointer.
    policy : dict or None
        Its retention policy as plain keys; ``None`` for a policy those keys
        cannot express.
    reason : str
        The policy's reason, for people (``"newest 5"``).
    """

    family: Family
    policy: dict[str, Any] | None
    reason: str

    def retention(self) -> RetentionPolicy | None:
        """The policy the plain keys build, or ``None``."""
        if self.policy is None:
            return None
        try:
            return policy_from_dict(self.policy)
        except ValueError:
            return None


@dataclass(frozen=True)
class Manifest:
    """What a store says of itself.

    Attributes
    ----------
    format : str
        The serialization format of its checkpoints.
    families : tuple of FamilyInfo
        Its families, the primary one (the one ``latest`` means) first.
    """

    format: str
    families: tuple[FamilyInfo, ...]

    def to_json(self) -> str:
        """The text stored on disk."""
        data = {
            "format_version": MANIFEST_VERSION,
            "format": self.format,
            "families": [
                {
                    "prefix": f.family.prefix,
                    "suffix": f.family.suffix,
                    "pointer": f.family.pointer,
                    "policy": f.policy,
                    "reason": f.reason,
                }
                for f in self.families
            ],
        }
        return json.dumps(data, indent=1) + "\n"


def describe(format: str, families: list[tuple[Family, RetentionPolicy]]) -> Manifest:
    """The manifest of a store of ``format`` holding ``families`` (primary first)."""
    return Manifest(
        format,
        tuple(
            FamilyInfo(family, policy_to_dict(policy), reason_of(policy))
            for family, policy in families
        ),
    )


def write_manifest(directory: Path, manifest: Manifest, *, durable: bool) -> Path:
    """Write ``D/.dp_ckpt.store.json`` atomically; return its path."""
    path = directory / MANIFEST_NAME
    write_text_atomic(path, manifest.to_json(), durable=durable)
    return path


def read_manifest(directory: Path) -> Manifest | None:
    """Read ``D/.dp_ckpt.store.json``; ``None`` when there is none.

    Raises
    ------
    InvalidRecordError
        When it exists but is malformed or of a newer version.
    """
    path = directory / MANIFEST_NAME
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRecordError(f"cannot read store manifest {path}: {exc}") from exc
    try:
        version = data["format_version"]
        if type(version) is not int or version > MANIFEST_VERSION:
            raise InvalidRecordError(
                f"store manifest {path} has version {version!r}, newer than this "
                f"plugin reads ({MANIFEST_VERSION}); upgrade dp-ckpt-plugin"
            )
        families = []
        for entry in data["families"]:
            policy = entry.get("policy")
            if policy is not None and type(policy) is not dict:
                raise TypeError("policy")
            families.append(
                FamilyInfo(
                    Family(entry["prefix"], entry["suffix"], entry["pointer"]),
                    policy,
                    str(entry.get("reason", "")),
                )
            )
        if type(data["format"]) is not str or not families:
            raise TypeError("format")
        return Manifest(data["format"], tuple(families))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidRecordError(
            f"store manifest {path} is malformed ({type(exc).__name__}: {exc})"
        ) from None
