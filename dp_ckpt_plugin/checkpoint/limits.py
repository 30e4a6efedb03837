"""One table of limits: every number, text and size the store writes and reads.

Commit records, the store's manifest, HEAD and LEASE take each bound from
here, the code that writes them and the code that reads them alike, so a
writer never writes a value its own reader refuses: a value out of bounds is
refused by the writer (``ValueError`` naming the field) before anything is
written. ``docs/guarantees.md`` (rule 44) states the table;
``tests/test_limits.py`` walks it, field by field.

Records of format version 1 (dp-ckpt-plugin 0.1 and 0.2, which bounded no
step) are read with any non-negative step.
"""

from __future__ import annotations

#: Largest step, size, count, sequence number or epoch (a signed 64-bit int).
MAX_INT = (1 << 63) - 1
#: Largest step a checkpoint may have.
MAX_STEP = MAX_INT
#: Largest epoch of a remote store's writer (LEASE and HEAD).
MAX_EPOCH = MAX_INT
#: Largest time (the end of the year 9999, as Unix time): records, HEAD, LEASE.
MAX_TIME = 253402300799.0
#: Longest name, family, format, key or metric name (characters).
MAX_TEXT = 4096
#: Most metrics one checkpoint carries.
MAX_METRICS = 256
#: Longest ``"<algorithm>:<hex>"`` digest text.
MAX_DIGEST_TEXT = 200
#: Most segments (one per run) a checkpoint's lineage keeps, in a record and in HEAD.
MAX_LINEAGE = 64
#: Most catalogue segments HEAD names per family (of a remote store).
MAX_SEGMENTS = 4096
#: Deepest level of a catalogue segment (one of level ``n`` names those of ``n - 1``).
MAX_SEGMENT_LEVEL = 8
#: Most families a store's manifest describes.
MAX_FAMILIES = 64
#: Longest prefix, suffix or pointer name in a manifest (a file name).
MAX_FILE_NAME = 255
#: Longest format name in a manifest.
MAX_FORMAT_NAME = 64
#: Longest policy reason a manifest keeps (longer ones are cut when read).
MAX_REASON = 200
#: Longest host, command and start time of a lease's holder.
MAX_HOLDER_HOST = 256
MAX_HOLDER_COMMAND = 500
MAX_HOLDER_SINCE = 64
#: Seconds a lease may hold without renewal: above 0, below this.
MAX_LEASE_SECONDS = 1e6
#: Longest version or backend name in a record's provenance.
MAX_VERSION_TEXT = 64
#: Largest world size a record's provenance names.
MAX_WORLD_SIZE = 1 << 20
#: Most data systems a record's provenance lists (more: counted and digested only).
MAX_SYSTEMS = 32
#: Longest data system path a record's provenance lists.
MAX_DATA_PATH = 1024

#: Most bytes of each small object, as read.
MAX_RECORD_BYTES = 64 * 1024
MAX_MANIFEST_BYTES = 256 * 1024
MAX_POINTER_BYTES = 4096
MAX_HEAD_BYTES = 16 << 20
MAX_SEGMENT_BYTES = 16 << 20
MAX_LEASE_BYTES = 64 * 1024
#: Most bytes of a stored training input (``D/inputs/<digest>.json``).
MAX_INPUT_BYTES = 1 << 20


def shorten(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about bad input."""
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python prints
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_int(value: object, high: int = MAX_INT, low: int = 0) -> bool:
    """Whether ``value`` is an int (not a bool) from ``low`` to ``high``."""
    return type(value) is int and low <= value <= high


def is_time(value: object) -> bool:
    """Whether ``value`` is a finite Unix time from 0 to :data:`MAX_TIME`."""
    # NaN and the infinities fail the comparison; an int of any size compares
    return type(value) in (int, float) and 0 <= value <= MAX_TIME


def is_text(value: object, longest: int = MAX_TEXT) -> bool:
    """Whether ``value`` is a non-empty string of at most ``longest`` characters."""
    return type(value) is str and 0 < len(value) <= longest


def check_int(value: object, what: str, high: int = MAX_INT, low: int = 0) -> int:
    """Return ``value`` if :func:`is_int`; else ``ValueError`` naming ``what``."""
    if not is_int(value, high, low):
        raise ValueError(
            f"{what} must be an int from {low} to {high}, got {shorten(value)}"
        )
    return value


def check_time(value: object, what: str) -> float:
    """Return ``value`` if :func:`is_time`; else ``ValueError`` naming ``what``."""
    if not is_time(value):
        raise ValueError(
            f"{what} must be a Unix time from 0 to {MAX_TIME:.0f}, got {shorten(value)}"
        )
    return value


def check_text(value: object, what: str, longest: int = MAX_TEXT) -> str:
    """Return ``value`` if :func:`is_text`; else ``ValueError`` naming ``what``."""
    if not is_text(value, longest):
        raise ValueError(
            f"{what} must be a non-empty string of at most {longest} characters, "
            f"got {shorten(value)}"
        )
    return value


def check_size(data: bytes, what: str, most: int) -> bytes:
    """Return ``data`` if it holds at most ``most`` bytes, else ``ValueError``."""
    if len(data) > most:
        raise ValueError(
            f"{what} would hold {len(data)} bytes, more than the {most} its readers accept"
        )
    return data
