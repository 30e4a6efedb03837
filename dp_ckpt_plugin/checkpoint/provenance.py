"""Where a checkpoint came from: the provenance its commit record carries.

A record's ``provenance`` names the versions that wrote the checkpoint
(plugin, deepmd-kit, torch, Python), the backend, the world size, the seed,
the host, the digest of the training input (as the trainer normalized it)
and the identity of its data systems: each system's path and a cheap
fingerprint (sizes, and digests of its small files). The input itself is
kept once per distinct digest, content-addressed, in
``D/inputs/<algorithm>-<hex>.json`` (:func:`write_input`): any checkpoint
can show the input it was trained with. Nothing of the environment is
kept, no credentials: keys named like a secret are dropped and the userinfo
of URLs is removed (:func:`scrubbed`).

Every field is bounded in ``checkpoint/limits.py``; records without provenance
(written before it existed) are read as before. See ``docs/guarantees.md``
(rules 51 to 53).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidRecordError, UnreadableFileError
from ..storage import Storage
from ..text import scrub_url
from .limits import (
    MAX_DATA_PATH,
    MAX_DIGEST_TEXT,
    MAX_HOLDER_HOST,
    MAX_INPUT_BYTES,
    MAX_INT,
    MAX_SYSTEMS,
    MAX_VERSION_TEXT,
    MAX_WORLD_SIZE,
    check_int,
    check_size,
    check_text,
    is_int,
    is_text,
    shorten,
)

#: Folder of a store holding the training inputs its checkpoints name.
INPUTS_DIR = "inputs"
#: The roles of a data system.
ROLES = ("training", "validation")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SECRET_KEY = re.compile(
    r"(?i)(password|passwd|secret|token|credential|access_key|api_key|private_key)"
)


def digest_bytes(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def scrubbed(value: Any) -> Any:
    """``value`` with keys named like a secret dropped and URL userinfo removed."""
    if isinstance(value, Mapping):
        return {
            str(k): scrubbed(v)
            for k, v in value.items()
            if not _SECRET_KEY.search(str(k))
        }
    if isinstance(value, list | tuple):
        return [scrubbed(v) for v in value]
    if isinstance(value, str):
        return scrub_url(value)
    return value


def input_digest(config: Mapping[str, Any]) -> str:
    """The digest of a training input (scrubbed, canonical JSON)."""
    return digest_bytes(canonical(scrubbed(config)))


def input_fits(config: Mapping[str, Any]) -> bool:
    """Whether a training input is small enough to be kept (:func:`write_input`)."""
    return len(canonical(scrubbed(config))) <= MAX_INPUT_BYTES


# -- the fields ---------------------------------------------------------------------


@dataclass(frozen=True)
class DataSystem:
    """One data system: its ``role`` (training, validation), path and fingerprint."""

    role: str
    path: str
    fingerprint: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "path": self.path, "fingerprint": self.fingerprint}


@dataclass(frozen=True)
class DataIdentity:
    """The data systems of a run: how many, one digest over all, and the list.

    ``systems`` lists every system when there are at most
    ``MAX_SYSTEMS`` (``checkpoint/limits.py``) with paths of at most
    ``MAX_DATA_PATH`` (``checkpoint/limits.py``) characters, none otherwise (``count`` and
    ``digest`` still tell one set from another).
    """

    count: int
    digest: str
    systems: tuple[DataSystem, ...] = ()

    @classmethod
    def of(cls, systems: Iterable[DataSystem]) -> DataIdentity:
        listed = tuple(systems)
        digest = digest_bytes(canonical([s.to_dict() for s in listed]))
        fits = len(listed) <= MAX_SYSTEMS and all(
            is_text(s.path, MAX_DATA_PATH) for s in listed
        )
        return cls(len(listed), digest, listed if fits else ())

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "systems": [s.to_dict() for s in self.systems]}


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint came from (every field but ``plugin`` and ``python`` may be unknown)."""

    plugin: str
    python: str
    deepmd_kit: str | None = None
    torch: str | None = None
    backend: str | None = None
    world_size: int = 1
    seed: int | None = None
    host: str | None = None
    input: str | None = None
    data: DataIdentity | None = None

    def check(self) -> None:
        """Refuse (``ValueError``) a field beyond what readers accept."""
        for key in ("plugin", "python", "deepmd_kit", "torch", "backend"):
            value = getattr(self, key)
            if value is not None or key in ("plugin", "python"):
                check_text(value, f"provenance {key}", MAX_VERSION_TEXT)
        check_int(self.world_size, "provenance world_size", MAX_WORLD_SIZE, 1)
        if self.seed is not None:
            check_int(self.seed, "provenance seed", MAX_INT, -MAX_INT)
        if self.host is not None:
            check_text(self.host, "provenance host", MAX_HOLDER_HOST)
        if self.input is not None:
            _digest(self.input, "provenance input", ValueError)
        if self.data is not None:
            _check_data(self.data, ValueError)

    def to_dict(self) -> dict[str, Any]:
        self.check()
        data = None if self.data is None else self.data.to_dict()
        return {**vars(self), "data": data}

    @classmethod
    def from_dict(cls, value: object, source: object) -> Provenance:
        """Parse a record's ``provenance`` strictly (:class:`InvalidRecordError`)."""

        def bad(what: str) -> InvalidRecordError:
            return InvalidRecordError(
                f"commit record {source}: provenance {what}, got {shorten(value)}"
            )

        if type(value) is not dict:
            raise bad("must be an object")
        fields: dict[str, Any] = {}
        for key in ("plugin", "python", "deepmd_kit", "torch", "backend"):
            text = value.get(key)
            if (text is not None or key in ("plugin", "python")) and not is_text(
                text, MAX_VERSION_TEXT
            ):
                raise bad(f"{key} must be a version text")
            fields[key] = text
        world = value.get("world_size", 1)
        if not is_int(world, MAX_WORLD_SIZE, 1):
            raise bad("world_size must be an int from 1")
        seed = value.get("seed")
        if seed is not None and not is_int(seed, MAX_INT, -MAX_INT):
            raise bad("seed must be an int or null")
        host = value.get("host")
        if host is not None and not is_text(host, MAX_HOLDER_HOST):
            raise bad("host must be a text")
        digest = value.get("input")
        if digest is not None:
            _digest(digest, f"commit record {source}: provenance input")
        data = value.get("data")
        if data is not None:
            data = _data_from(data, source)
        return cls(
            **fields, world_size=world, seed=seed, host=host, input=digest, data=data
        )


def _digest(value: object, what: str, error: type[Exception] = InvalidRecordError):
    if not (is_text(value, MAX_DIGEST_TEXT) and _DIGEST.fullmatch(value)):
        raise error(f"{what} must be 'sha256:<64 hex>', got {shorten(value)}")


def _check_data(data: DataIdentity, error: type[Exception]) -> None:
    if not is_int(data.count):
        raise error(f"provenance data count must be an int, got {shorten(data.count)}")
    _digest(data.digest, "provenance data digest", error)
    if len(data.systems) > MAX_SYSTEMS:
        raise error(f"provenance lists at most {MAX_SYSTEMS} data systems")
    if data.systems and len(data.systems) != data.count:
        raise error("provenance lists some data systems but not all")
    for system in data.systems:
        if system.role not in ROLES:
            raise error(f"a data system's role is one of {ROLES}, got {system.role!r}")
        if not is_text(system.path, MAX_DATA_PATH):
            raise error(
                f"a data system's path is a text of at most {MAX_DATA_PATH} "
                f"characters, got {shorten(system.path)}"
            )
        _digest(system.fingerprint, "a data system's fingerprint", error)


def _data_from(value: object, source: object) -> DataIdentity:
    listed = value.get("systems", []) if type(value) is dict else None
    if type(listed) is list and all(type(item) is dict for item in listed):
        keys = ("role", "path", "fingerprint")
        systems = tuple(DataSystem(*map(item.get, keys)) for item in listed)
        data = DataIdentity(value.get("count"), value.get("digest"), systems)
        with contextlib.suppress(InvalidRecordError):
            _check_data(data, InvalidRecordError)
            return data
    raise InvalidRecordError(
        f"commit record {source}: provenance data must hold a count, a digest "
        f"and at most {MAX_SYSTEMS} systems, got {shorten(value)}"
    )


# -- the stored inputs -------------------------------------------------------------


def input_path(directory: Path, digest: str) -> Path:
    """Where the input of ``digest`` is kept in the store ``directory``."""
    algorithm, _, hexdigest = digest.partition(":")
    return directory / INPUTS_DIR / f"{algorithm}-{hexdigest}.json"


def write_input(
    directory: Path, config: Mapping[str, Any], *, storage: Storage, durable: bool
) -> str:
    """Keep ``config`` (scrubbed) in ``directory``; return its digest.

    Written once per digest, atomically.

    Raises
    ------
    ValueError
        An input above ``MAX_INPUT_BYTES`` (``checkpoint/limits.py``) (nothing written).
    """
    data = check_size(
        canonical(scrubbed(config)), "a kept training input", MAX_INPUT_BYTES
    )
    digest = digest_bytes(data)
    path = input_path(directory, digest)
    if storage.entry(path) is None:
        storage.make_dirs(path.parent, durable=durable)
        storage.write_atomic(path, data, durable=durable)
    return digest


def read_input(
    directory: Path, digest: str, *, storage: Storage
) -> dict[str, Any] | None:
    """The input of ``digest`` kept in ``directory`` (or the store above an archive).

    ``None`` when it is not there, unreadable, or not what its name says.
    """
    for base in (directory, directory.parent.parent):
        with contextlib.suppress(UnreadableFileError):
            data = storage.read_small(input_path(base, digest), MAX_INPUT_BYTES)
            value = None if data is None else parse_input(data, digest)
            if value is not None:
                return value
    return None


def parse_input(data: bytes, digest: str) -> dict[str, Any] | None:
    """A kept input's bytes as an object, or ``None`` when they are not ``digest``'s."""
    if digest_bytes(data) != digest:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# -- comparing inputs --------------------------------------------------------------

#: Stands for a key one input does not have.
ABSENT = object()


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys (``training.numb_steps``) to values; lists are values."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, f"{name}."))
        else:
            out[name] = item
    return out


def input_changes(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Every key whose value differs, sorted: ``(key, old, new)``, :data:`ABSENT` for none."""
    before, after = flatten(old), flatten(new)
    return [
        (key, before.get(key, ABSENT), after.get(key, ABSENT))
        for key in sorted(set(before) | set(after))
        if before.get(key, ABSENT) != after.get(key, ABSENT)
    ]


def value_text(value: Any, limit: int = 80) -> str:
    """A value of an input, as one short line (``(absent)`` for :data:`ABSENT`)."""
    if value is ABSENT:
        return "(absent)"
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- what every run knows of itself ------------------------------------------------


def version_of(distribution: str) -> str | None:
    """The installed version of ``distribution`` (not imported), or ``None``."""
    from importlib import metadata

    try:
        found = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    return found if is_text(found, MAX_VERSION_TEXT) else None


def provenance_of(
    *,
    world_size: int = 1,
    backend: str | None = None,
    seed: int | None = None,
    data: DataIdentity | None = None,
) -> Provenance:
    """This process's provenance: versions and host, with what the caller knows."""
    import platform

    from .. import __version__

    host = platform.node()
    return Provenance(
        plugin=__version__,
        python=platform.python_version(),
        deepmd_kit=version_of("deepmd-kit"),
        torch=version_of("torch"),
        backend=backend,
        world_size=world_size,
        seed=seed,
        host=host if is_text(host, MAX_HOLDER_HOST) else None,
        data=data,
    )
