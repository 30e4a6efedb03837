"""Showing text that came from outside: one line, no control character, bounded.

Everything a store reads from object storage or a staging directory (LEASE
holders, HEAD keys and family names, record fields, names in errors) is
shown to a person only through :func:`shown`: control characters (escape,
carriage return, line feed, the bidirectional overrides, line and
paragraph separators) are written as Python escapes (``\\x1b``, ``\\n``,
``\\u202e``), so no value can colour a terminal, move its cursor, rewrite a
line or split one line into two; a value longer than the limit is cut,
saying by how much; and no URL keeps its userinfo (``user:password@``).

The package's logger (``dp_ckpt_plugin``) passes every message through
:func:`shown` as well (:func:`guard_logger`), so a log line stays one line
whatever a message carries.
"""

from __future__ import annotations

import logging
import re
from itertools import accumulate

#: Most characters :func:`shown` keeps of one value.
MAX_SHOWN = 300
#: Most characters of one log line of the package's logger.
MAX_LOG_LINE = 4000
#: The userinfo of a URL (``user:password@``): never shown.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*:[^/\s@]*@")
_HTTP_USER = re.compile(r"(?i)\b(https?://)[^/\s@]+@")


def scrub_url(text: str) -> str:
    """``text`` with the userinfo of its URLs as ``***`` (``http://***@host``).

    Any ``user:password@``, and any userinfo of an ``http(s)`` URL (an
    endpoint's); ``abfs://container@account`` names no secret and stays.
    """
    return _HTTP_USER.sub(r"\1***@", _USERINFO.sub(r"\1***@", text))


def _piece(char: str) -> str:
    """``char`` itself if printable (the space is), else its escape as ``repr`` writes it."""
    return char if char.isprintable() else repr(char)[1:-1]


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``value`` as text fit to show: one line, printable, at most ``limit`` long.

    Printable characters (letters of any script, digits, punctuation, the
    space) are kept; every other one is escaped; the userinfo of a URL is
    scrubbed (:func:`scrub_url`). What would run past ``limit`` characters
    is replaced by ``...(N more characters)``, so the result is never
    longer than ``limit``.
    """
    text = scrub_url(value if isinstance(value, str) else str(value))
    # a piece is one character or more: past limit + 1 characters, too long
    pieces = list(map(_piece, text[: limit + 1]))
    if len(text) <= limit and sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    room = limit - len(f"...({len(text)} more characters)")
    ends = accumulate(map(len, pieces))
    cut = next(index for index, end in enumerate(ends) if end > room)
    return "".join(pieces[:cut]) + f"...({len(text) - cut} more characters)"


class _OneLine(logging.Filter):
    """Renders each message of the logger it guards through :func:`shown`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: logging reports it itself
            return True
        record.msg, record.args = shown(message, MAX_LOG_LINE), None
        return True


def guard_logger(name: str = "dp_ckpt_plugin") -> None:
    """Make every message of logger ``name`` one shown line (idempotent).

    The guard formats the message, so it must see what other filters made
    of the record: called again after another filter was added, it moves
    itself behind it.
    """
    logger = logging.getLogger(name)
    for old in [f for f in logger.filters if isinstance(f, _OneLine)]:
        logger.removeFilter(old)
    logger.addFilter(_OneLine())
