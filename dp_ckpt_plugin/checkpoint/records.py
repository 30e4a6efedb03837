"""Commit records: the evidence that makes a checkpoint count.

A checkpoint ``D/<name>`` is committed once ``D/.<name>.commit.json`` exists and
describes it: its size and content digest, the step, the family, the format
and the record format version (and the metrics the trainer reported with it,
if any), and the payload agrees with it. The record is written atomically and
durably before the payload gets its name; readers ignore a numbered file
without a record and a record without its file.

A record is parsed strictly: malformed, of a newer format version, or
disagreeing with the file it sits beside, it means "not committed". Records
of format version 1 (dp-ckpt-plugin 0.1 and 0.2) hold a ``sha256`` field,
some a ``backend`` field for the format; they are still read. Version 2 names
its digest algorithm: ``"digest": "blake3:<hex>"``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..errors import CorruptCheckpointError, InvalidRecordError, UnreadableFileError
from ..storage import PayloadBytes, Storage, default_storage
from .digests import ALGORITHMS, DEFAULT_ALGORITHM, digest_of, digest_of_view
from .layout import record_name
from .limits import (
    MAX_DIGEST_TEXT,
    MAX_HEAD_BYTES,
    MAX_INT,
    MAX_LINEAGE,
    MAX_METRICS,
    MAX_RECORD_BYTES,
    MAX_TEXT,
    check_int,
    check_size,
    check_text,
    check_time,
    is_int,
    is_text,
    is_time,
    shorten,
)
from .lineage import Lineage, Link
from .provenance import Provenance

#: Version of the record format this package writes; it reads 1 and 2.
FORMAT_VERSION = 2
_DIGEST = re.compile(r"([a-z0-9]+):([0-9a-f]+)")


@dataclass(frozen=True)
class CommitRecord:
    """What a committed checkpoint is.

    Attributes
    ----------
    name : str
        File name of the checkpoint in its directory.
    step : int
        Training step it was saved at.
    family : str
        Prefix of its family, such as ``model.ckpt``.
    format : str
        Name of the format that serialized it.
    size : int
        Size of the payload in bytes.
    digest : str
        ``"<algorithm>:<hex>"`` of the payload, such as ``"blake3:9f0c..."``.
    created : float
        Unix time of the commit.
    format_version : int
        Version of this record's format.
    replaces : (int, str) or None
        Size and digest of the payload a re-save of the same step is
        replacing: while the new payload is moved into place, either payload
        is the committed checkpoint of the step. ``None`` otherwise.
    metrics : dict or None
        What the trainer reported with the checkpoint (a validation error,
        say), metric name to value; ``None`` (a value that was not a finite
        number) stands for no value. ``None`` when nothing was reported.
        Retention's :class:`~dp_ckpt_plugin.retention.KeepBest` ranks by it.
    provenance : dp_ckpt_plugin.checkpoint.provenance.Provenance or None
        Where the checkpoint came from
        (:mod:`dp_ckpt_plugin.checkpoint.provenance`); ``None`` in
        records written before it was kept, or by a caller that gave none.
    lineage : (epoch, chain) or None
        What it continued from (``checkpoint/lineage.py``);
        ``None`` in records written before lineage was recorded.
    """

    name: str
    step: int
    family: str
    format: str
    size: int
    digest: str
    created: float = 0.0
    format_version: int = FORMAT_VERSION
    replaces: tuple[int, str] | None = None
    metrics: dict[str, float | None] | None = field(default=None, hash=False)
    provenance: Provenance | None = field(default=None, hash=False, compare=False)
    lineage: Lineage | None = field(default=None, hash=False)

    def to_json(self) -> str:
        """Serialize to the text stored on disk.

        Raises
        ------
        ValueError
            When a field, or the whole record, is beyond what readers accept
            (``checkpoint/limits.py``).
        """
        self.check()
        data = {key: value for key, value in vars(self).items() if value is not None}
        if self.replaces is not None:
            data["replaces"] = {"size": self.replaces[0], "digest": self.replaces[1]}
        # provenance and lineage serialize themselves
        text = json.dumps(data, indent=1, sort_keys=True, default=_to_dict) + "\n"
        check_size(
            text.encode("utf-8"), f"the commit record of {self.name}", MAX_RECORD_BYTES
        )
        return text

    def check(self) -> None:
        """Refuse (``ValueError``) a field beyond what readers accept (``checkpoint/limits.py``)."""
        for key in ("name", "family", "format"):
            check_text(getattr(self, key), f"a commit record's {key}")
        check_int(self.step, "a step")
        check_int(self.size, "a checkpoint's size")
        check_int(self.format_version, "a record's format version", low=1)
        check_time(self.created, "a commit time")
        _check_digest(self.digest, "a new commit record", ValueError)
        if self.replaces is not None:
            check_int(self.replaces[0], "the size a re-save replaces")
            _check_digest(self.replaces[1], "a new commit record", ValueError)
        check_metrics(self.metrics)
        for part in (self.provenance, self.lineage):
            if part is not None:
                part.check()

    @property
    def algorithm(self) -> str:
        """The digest algorithm, such as ``"blake3"``."""
        return self.digest.partition(":")[0]

    def accepts(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes may be the one this record describes."""
        return size == self.size or (
            self.replaces is not None and size == self.replaces[0]
        )

    @classmethod
    def from_json(cls, text: str, *, source: Path) -> CommitRecord:
        """Parse a record strictly, raising :class:`InvalidRecordError` if malformed."""
        data = load_json(text, source, "commit record")
        if not isinstance(data, dict):
            raise InvalidRecordError(f"commit record {source} is not a JSON object")

        def bad(complaint: str) -> InvalidRecordError:
            return InvalidRecordError(f"commit record {source}: {complaint}")

        if "format" not in data and "backend" in data:
            data["format"] = data.pop("backend")  # records written by 0.1
        version = data.get("format_version")
        if type(version) is int and version > FORMAT_VERSION:
            raise InvalidRecordError(
                f"commit record {source} has format version {version}, "
                f"newer than this plugin reads ({FORMAT_VERSION}); upgrade dp-ckpt-plugin"
            )
        if version == 1:
            data["digest"] = _v1_digest(data.get("sha256"), bad)
            replaces = data.get("replaces")
            if type(replaces) is dict and "sha256" in replaces:
                replaces["digest"] = _v1_digest(replaces.pop("sha256"), bad)
        # dp-ckpt-plugin 0.1 and 0.2 bounded no step: a version 1 record's is read
        top = {"step": math.inf} if version == 1 else {}
        for key, kind in _FIELDS.items():
            value = data.get(key)
            if type(value) is not kind:
                raise bad(f"key {key!r} must be {kind.__name__}, got {shorten(value)}")
            if kind is int and not is_int(value, top.get(key, MAX_INT)):
                raise bad(
                    f"key {key!r} must be between 0 and {MAX_INT}, got {shorten(value)}"
                )
            if kind is str and not is_text(value):
                raise bad(
                    f"key {key!r} must be a non-empty string of at most {MAX_TEXT} characters"
                )
        created = data.get("created", 0.0)
        if not is_time(created):
            raise bad(f"key 'created' must be a Unix time, got {shorten(created)}")
        if data["format_version"] < 1:
            raise bad("format version must be at least 1")
        _check_digest(data["digest"], source)
        replaces = data.get("replaces")
        if replaces is not None:
            if (
                type(replaces) is not dict
                or set(replaces) != {"size", "digest"}
                or not is_int(replaces["size"])
                or type(replaces["digest"]) is not str
            ):
                raise bad("'replaces' must hold a size and a digest")
            _check_digest(replaces["digest"], source)
            replaces = (replaces["size"], replaces["digest"])
        metrics = data.get("metrics")
        if metrics is not None and (metrics := _metrics_from_json(metrics)) is None:
            raise bad("'metrics' must map names to finite numbers or null")
        provenance = data.get("provenance")
        if provenance is not None:
            provenance = Provenance.from_dict(provenance, source)
        lineage = data.get("lineage")
        if lineage is not None and (lineage := Lineage.parse(lineage)) is None:
            raise bad(
                f"'lineage' must hold an epoch and at most {MAX_LINEAGE} "
                "[epoch, step, digest] links"
            )
        return cls(
            **{key: data[key] for key in _FIELDS},
            created=float(created),
            replaces=replaces,
            metrics=metrics or None,
            provenance=provenance,
            lineage=lineage,
        )

    def describes(self, name: str) -> bool:
        """Whether this record's name, family and step are those of file ``name``."""
        head = f"{self.family}-{self.step}."
        return name == self.name and name.startswith(head) and "/" not in name


_FIELDS = {
    "name": str,
    "step": int,
    "family": str,
    "format": str,
    "size": int,
    "digest": str,
    "format_version": int,
}


def _to_dict(value: Provenance | Lineage) -> dict:
    return value.to_dict()


def _v1_digest(value: object, bad: Callable[[str], Exception]) -> str:
    if type(value) is not str or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise bad(f"sha256 is not 64 hex digits, got {shorten(value)}")
    return f"sha256:{value}"


def _check_digest(
    value: object, source: object, error: type[Exception] = InvalidRecordError
) -> None:
    found = _DIGEST.fullmatch(value) if is_text(value, MAX_DIGEST_TEXT) else None
    if not found or ALGORITHMS.get(found.group(1)) != len(found.group(2)):
        raise error(
            f"commit record {source}: digest must be '<algorithm>:<hex>' with an "
            f"algorithm of {sorted(ALGORITHMS)}, got {shorten(value)}"
        )


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def load_json(text: str, source: object, what: str) -> object:
    """Parse untrusted JSON strictly: no NaN or Infinity; deep nesting is an error.

    Raises
    ------
    InvalidRecordError
        Naming ``what`` and ``source``.
    """
    if len(text) > MAX_HEAD_BYTES:
        raise InvalidRecordError(f"{what} {source} is too large to be one")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRecordError(
            f"{what} {source} is not valid JSON: {shorten(str(exc), 120)}"
        ) from None


def read_text(
    path: Path, most: int, what: str, storage: Storage | None = None
) -> str | None:
    """The text of a small file (at most ``most`` bytes), or ``None`` when absent.

    Raises
    ------
    InvalidRecordError
        Naming ``what``, when it is unreadable or not UTF-8.
    """
    try:
        data = (storage or default_storage()).read_small(path, most)
        return None if data is None else data.decode("utf-8")
    except UnreadableFileError as exc:
        raise InvalidRecordError(f"{what} {exc}") from None
    except UnicodeDecodeError:
        raise InvalidRecordError(f"{what} {path} is not UTF-8 text") from None


def record_path(checkpoint: Path) -> Path:
    """Return where the commit record of ``checkpoint`` lives."""
    return checkpoint.parent / record_name(checkpoint.name)


def make_record(
    checkpoint: Path,
    *,
    step: int,
    family: str,
    format: str,
    storage: Storage,
    name: str | None = None,
    digest: str | None = None,
    metrics: Mapping[str, float] | None = None,
    payload: PayloadBytes | None = None,
    provenance: Provenance | None = None,
    lineage: Lineage | None = None,
) -> CommitRecord:
    """Describe a durable payload.

    ``name`` is the file name the record is for, when ``checkpoint`` is still
    a temporary file; ``digest`` what was computed once it was written (the
    file is measured), or ``payload`` the bytes read from it, else the file is
    measured and hashed now; ``metrics`` (see :func:`check_metrics`) what the trainer
    reported with it.
    """
    if payload is not None:
        with memoryview(payload.data) as view:
            digest, size = digest_of_view(view, DEFAULT_ALGORITHM), payload.size
    else:
        found = storage.entry(checkpoint)
        if found is None:
            raise FileNotFoundError(f"{checkpoint} is gone")
        size = found.size
    return CommitRecord(
        name=name or checkpoint.name,
        step=step,
        family=family,
        format=format,
        size=size,
        digest=digest or digest_of(checkpoint, DEFAULT_ALGORITHM, storage=storage),
        created=time.time(),
        metrics=check_metrics(metrics),
        provenance=provenance,
        lineage=lineage,
    )


#: The longest commit time's text (a time of 17 digits), for :func:`check_fits`.
_WIDEST_TIME = 253402300798.99997


def check_fits(
    name: str,
    step: int,
    family: str,
    format: str,
    metrics: dict[str, float | None] | None,
    provenance: Provenance | None = None,
) -> None:
    """Refuse a checkpoint whose commit record readers would refuse.

    Called before anything of the checkpoint is written: the record is built
    with the widest size, digest, commit time and replaced payload, so the
    one written later is no larger.

    Raises
    ------
    ValueError
        Naming the field, or the record's size, beyond ``checkpoint/limits.py``.
    """
    widest = f"{DEFAULT_ALGORITHM}:{'f' * ALGORITHMS[DEFAULT_ALGORITHM]}"
    CommitRecord(
        name=name,
        step=step,
        family=family,
        format=format,
        size=MAX_INT,
        digest=widest,
        created=_WIDEST_TIME,
        replaces=(MAX_INT, widest),
        metrics=metrics,
        provenance=provenance,
        lineage=Lineage(MAX_INT, (Link(MAX_INT, MAX_INT, widest),) * MAX_LINEAGE),
    ).to_json()


def check_saves(
    step: int,
    paths: Mapping[str, Path],
    format: str,
    metrics: Mapping[str, Mapping[str, float] | None] | None,
    provenance: Provenance | None = None,
) -> dict[str, dict[str, float | None] | None]:
    """Check the metrics and the records of one step's saves before any is written.

    ``paths`` maps each family to its checkpoint, ``metrics`` each family to
    what it reports; returns the metrics as records hold them
    (:func:`check_metrics`), after :func:`check_fits` of every record.
    """
    reported = {f: check_metrics(m) for f, m in (metrics or {}).items()}
    for family, path in paths.items():
        check_fits(path.name, step, family, format, reported.get(family), provenance)
    return reported


def write_record(
    checkpoint: Path, record: CommitRecord, *, storage: Storage, durable: bool = True
) -> Path:
    """Commit ``checkpoint`` by writing its record atomically; return its path."""
    path = record_path(checkpoint)
    storage.write_atomic(path, record.to_json().encode("utf-8"), durable=durable)
    return path


def read_record(
    checkpoint: Path, *, storage: Storage | None = None
) -> CommitRecord | None:
    """Return the record of ``checkpoint``, or ``None`` if it has none.

    Raises
    ------
    InvalidRecordError
        When a record exists but is malformed, of a newer format version, or
        describes another file (its name, family or step disagree with the
        file it sits beside): the checkpoint is then not committed.
    """
    path = record_path(checkpoint)
    text = read_text(path, MAX_RECORD_BYTES, "commit record", storage)
    return (
        None if text is None else parse_record(text, source=path, name=checkpoint.name)
    )


def parse_record(text: str, *, source, name: str) -> CommitRecord:
    """Parse the record text of the checkpoint called ``name``, strictly.

    Raises
    ------
    InvalidRecordError
        When malformed, too new, or describing another file.
    """
    record = CommitRecord.from_json(text, source=source)
    if not record.describes(name):
        raise InvalidRecordError(
            f"commit record {source} describes {record.name!r} (family "
            f"{record.family!r}, step {record.step}), not {name!r}"
        )
    return record


def verify(
    checkpoint: Path,
    record: CommitRecord,
    *,
    digest: bool,
    storage: Storage | None = None,
) -> None:
    """Check a payload against its record.

    Parameters
    ----------
    checkpoint : Path
        The payload.
    record : CommitRecord
        Its commit record.
    digest : bool
        Whether to hash the payload too, with the record's algorithm (the
        size is always checked).

    Raises
    ------
    CorruptCheckpointError
        Naming the file and what does not match.
    """
    storage = storage or default_storage()
    try:
        found = storage.entry(checkpoint, follow=True)
        if found is None:
            raise FileNotFoundError(f"checkpoint {checkpoint} is gone")
        if not found.is_file:
            raise CorruptCheckpointError(
                f"checkpoint {checkpoint} is not a regular file ({found.kind})"
            )
        _check_size(checkpoint, found.size, record)
        if digest:
            hashed = partial(digest_of, checkpoint, storage=storage)
            _check_digest_of(checkpoint, record, hashed)
    except UnreadableFileError as exc:
        raise CorruptCheckpointError(f"checkpoint {exc}") from None


def check_payload(payload: PayloadBytes, record: CommitRecord, *, digest: bool) -> None:
    """Check bytes read from a checkpoint (:meth:`~dp_ckpt_plugin.storage.local.LocalStorage.read_payload`) against its record.

    As :func:`verify`, on the bytes in memory: what is checked here is what
    the caller then loads, whatever happens to the file meanwhile.

    Raises
    ------
    CorruptCheckpointError
        Naming the file and what does not match.
    """
    _check_size(payload.path, payload.size, record)
    if digest:
        with memoryview(payload.data) as view:
            _check_digest_of(payload.path, record, partial(digest_of_view, view))


def _check_size(checkpoint: Path, size: int, record: CommitRecord) -> None:
    if not record.accepts(size):
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint} has {size} bytes but its commit record says {record.size} "
            "(torn or truncated write)"
        )


def _check_digest_of(
    checkpoint: Path, record: CommitRecord, digest_with: Callable[[str], str]
) -> None:
    """Compare ``digest_with(algorithm)`` with the record's digest (or the one it replaces)."""
    allowed = {record.digest}
    if record.replaces is not None:
        allowed.add(record.replaces[1])
    actual = {d: digest_with(d.partition(":")[0]) for d in allowed}
    if not any(actual[d] == d for d in allowed):
        mine = actual[record.digest]
        raise CorruptCheckpointError(
            f"checkpoint {checkpoint} does not match the {record.algorithm} digest "
            f"of its commit record ({mine.partition(':')[2][:12]}… instead of "
            f"{record.digest.partition(':')[2][:12]}…)"
        )


# -- metrics ------------------------------------------------------------------------


def check_metrics(
    metrics: Mapping[str, float] | None,
) -> dict[str, float | None] | None:
    """Return ``metrics`` as a record holds them, or ``None`` for none.

    Names are non-empty strings and values real numbers (not bools) or
    ``None`` ("no value"); a value that is not finite (a diverged loss) is
    kept as ``None``, since JSON has no NaN. An empty mapping is ``None``.

    Raises
    ------
    TypeError
        Naming the offending name or value.
    ValueError
        More than ``MAX_METRICS`` metrics, or a name longer
        than ``MAX_TEXT`` characters.
    """
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"metrics must map names to numbers, got {type(metrics).__name__}"
        )
    if len(metrics) > MAX_METRICS:
        raise ValueError(
            f"a checkpoint carries at most {MAX_METRICS} metrics, got {len(metrics)}"
        )
    checked: dict[str, float | None] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"a metric name is a non-empty string, got {shorten(key)}")
        check_text(key, "a metric name")
        if value is None:
            checked[key] = None
            continue
        if isinstance(value, bool):
            raise TypeError(f"metric {key!r} must be a number, got the bool {value!r}")
        if not isinstance(value, (int, float)):
            try:
                value = float(value)  # numpy and torch scalars
            except (TypeError, ValueError):
                raise TypeError(
                    f"metric {key!r} must be a number, got {type(value).__name__} {value!r}"
                ) from None
        checked[key] = float(value) if math.isfinite(value) else None
    return checked or None


def _metrics_from_json(value: object) -> dict[str, float | None] | None:
    """The ``metrics`` of a record, read strictly; ``None`` when malformed."""
    if type(value) is not dict or len(value) > MAX_METRICS:
        return None
    if not all(
        is_text(k)
        and (
            v is None
            or (type(v) is float and math.isfinite(v))
            or is_int(v, low=-MAX_INT)
        )
        for k, v in value.items()
    ):
        return None
    return {k: None if v is None else float(v) for k, v in value.items()}
