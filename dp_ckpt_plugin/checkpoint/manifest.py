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
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidRecordError
from ..retention import RetentionPolicy, policy_from_dict, policy_to_dict, reason_of
from ..storage import Storage
from .layout import MANIFEST_NAME, Family
from .limits import (
    MAX_FAMILIES,
    MAX_FILE_NAME,
    MAX_FORMAT_NAME,
    MAX_MANIFEST_BYTES,
    MAX_REASON,
    check_size,
    check_text,
    is_text,
)
from .records import load_json, read_text, shorten

log = logging.getLogger("dp_ckpt_plugin")

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
        policy = dict(self.policy)
        if "max_ckpt_keep" in policy and "keep_last" not in policy:
            policy["keep_last"] = policy.pop("max_ckpt_keep")  # written by 0.2
        try:
            return policy_from_dict(policy)
        except (ValueError, TypeError):
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
        """The text stored on disk.

        Raises
        ------
        ValueError
            When a field, or the whole manifest, is beyond what readers
            accept (``checkpoint/limits.py``).
        """
        check_text(self.format, "a manifest's format", MAX_FORMAT_NAME)
        if not 0 < len(self.families) <= MAX_FAMILIES:
            raise ValueError(
                f"a manifest describes 1 to {MAX_FAMILIES} families, "
                f"got {len(self.families)}"
            )
        families = []
        for info in self.families:
            names = asdict(info.family)  # prefix, suffix, pointer
            for key, name in names.items():
                check_text(name, f"a family's {key}", MAX_FILE_NAME)
            families.append({**names, "policy": info.policy, "reason": info.reason})
        data = {"format_version": MANIFEST_VERSION, "format": self.format}
        text = json.dumps({**data, "families": families}, indent=1) + "\n"
        check_size(text.encode("utf-8"), "the store's manifest", MAX_MANIFEST_BYTES)
        return text


def describe(format: str, families: list[tuple[Family, RetentionPolicy]]) -> Manifest:
    """The manifest of a store of ``format`` holding ``families`` (primary first)."""
    return Manifest(
        format,
        tuple(
            FamilyInfo(family, policy_to_dict(policy), reason_of(policy)[:MAX_REASON])
            for family, policy in families
        ),
    )


def describe_store(
    directory: Path, manifest: Manifest, last: Manifest | None, storage: Storage
) -> Manifest | None:
    """Write ``manifest`` unless it is ``last`` (written already); return what is on disk.

    Informative, like the lock's holder note: no fsync; a failure is a
    warning (and ``last`` is returned).
    """
    if manifest == last:
        return last
    try:
        write_manifest(directory, manifest, durable=False, storage=storage)
    except (OSError, ValueError) as exc:
        log.warning("could not describe the store in %s: %s", directory, exc)
        return last
    return manifest


def write_manifest(
    directory: Path, manifest: Manifest, *, durable: bool, storage: Storage
) -> Path:
    """Write ``D/.dp_ckpt.store.json`` atomically; return its path."""
    path = directory / MANIFEST_NAME
    storage.write_atomic(path, manifest.to_json().encode("utf-8"), durable=durable)
    return path


def read_manifest(
    directory: Path, *, storage: Storage | None = None
) -> Manifest | None:
    """Read ``D/.dp_ckpt.store.json``; ``None`` when there is none.

    Raises
    ------
    InvalidRecordError
        When it exists but is malformed or of a newer version.
    """
    path = directory / MANIFEST_NAME
    text = read_text(path, MAX_MANIFEST_BYTES, "store manifest", storage)
    if text is None:
        return None
    data = load_json(text, path, "store manifest")
    try:
        if type(data) is not dict:
            raise TypeError("not an object")
        version = data["format_version"]
        if type(version) is not int or version < 1:
            raise TypeError(f"format_version {shorten(version)}")
        if version > MANIFEST_VERSION:
            raise InvalidRecordError(
                f"store manifest {path} has version {version!r}, newer than this "
                f"plugin reads ({MANIFEST_VERSION}); upgrade dp-ckpt-plugin"
            )
        entries = data["families"]
        if type(entries) is not list or not 0 < len(entries) <= MAX_FAMILIES:
            raise TypeError("families")
        families = []
        for entry in entries:
            if type(entry) is not dict:
                raise TypeError("a family is not an object")
            fields = [entry["prefix"], entry["suffix"], entry["pointer"]]
            if not all(is_text(f, MAX_FILE_NAME) for f in fields):
                raise TypeError("prefix, suffix and pointer must be file names")
            if any("/" in f or "\0" in f for f in fields) or fields[2] in (".", ".."):
                raise ValueError("prefix, suffix and pointer must be bare names")
            policy = entry.get("policy")
            if policy is not None and type(policy) is not dict:
                raise TypeError("policy")
            reason = entry.get("reason", "")
            reason = reason[:MAX_REASON] if type(reason) is str else ""
            families.append(FamilyInfo(Family(*fields), policy, reason))
        if not is_text(data["format"], MAX_FORMAT_NAME):
            raise TypeError("format")
        return Manifest(data["format"], tuple(families))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidRecordError(
            f"store manifest {path} is malformed ({type(exc).__name__}: "
            f"{shorten(str(exc), 80)})"
        ) from None
