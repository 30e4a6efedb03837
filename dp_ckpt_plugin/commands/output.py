"""Printing for the commands: tables through ``rich`` (imported here, lazily), JSON.

Tables go to standard output; they are for people and may change. The JSON
form (``--json``) is for programs: its keys are documented in
``docs/command.md`` and carry ``"version": 1``.

Every string printed, and every cell of a table, is shown through
:func:`dp_ckpt_plugin.text.shown` as plain text (no ``rich`` markup): a
name or a field read from a store cannot colour the terminal or split a line.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ..text import shown

#: Version of the JSON the commands print.
JSON_VERSION = 1


def print_json(data: dict[str, Any]) -> None:
    """Print ``data`` as JSON, with the version first."""
    sys.stdout.write(json.dumps({"version": JSON_VERSION, **data}, indent=2) + "\n")


class Printer:
    """Prints ``rich`` renderables: styled on a terminal, plain text elsewhere.

    Elsewhere (a pipe, a file) there are no colours, the width is wide
    enough that no file name is cut, and lines carry no trailing spaces.
    """

    def __init__(self, *, stderr: bool = False) -> None:
        from rich.console import Console

        self.stream = sys.stderr if stderr else sys.stdout
        self.tty = self.stream.isatty()
        self.console = Console(
            file=self.stream,
            highlight=False,
            width=None if self.tty else 200,
            no_color=not self.tty,
        )

    def print(self, *renderables: Any) -> None:
        """Print, as ``rich.console.Console.print`` does (strings as plain text)."""
        plain = [_plain(r) for r in renderables]
        if self.tty:
            self.console.print(*plain)
            return
        with self.console.capture() as captured:  # to strip trailing spaces
            self.console.print(*plain)
        text = captured.get()
        self.stream.write("".join(line.rstrip() + "\n" for line in text.splitlines()))


def _plain(value: Any) -> Any:
    """A string as ``rich`` text shown verbatim, escaped; anything else as it is."""
    if not isinstance(value, str):
        return value
    from rich.text import Text

    return Text(shown(value, limit=10_000))


#: A :class:`Printer` on standard output (``stderr=True``: standard error).
console = Printer


def table(title: str | None, columns: list[str], *, right: tuple[str, ...] = ()):
    """An empty ``rich`` table with ``columns`` (those in ``right`` right-aligned)."""
    from rich import box
    from rich.table import Table

    class _Shown(Table):
        def add_row(self, *cells: Any, **options: Any) -> None:
            super().add_row(*(_plain(c) for c in cells), **options)

    out = _Shown(
        title=_plain(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for name in columns:
        out.add_column(name, justify="right" if name in right else "left")
    return out


def fields(rows: list[tuple[str, str]], out: Printer) -> None:
    """Print ``(name, value)`` rows through ``out``, the values aligned."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}")


def size(n: int | None) -> str:
    """A size for people: ``812 B``, ``1.2 MB``."""
    if n is None:
        return "-"
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            return f"{value:.1f} {unit}"


def utc(seconds: float | None) -> str:
    """A Unix time as ``2025-01-31 12:00:00`` UTC; ``-`` for none."""
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def metrics(values: dict[str, float | None] | None) -> str:
    """Metrics for people: ``rmse_val=0.0123 lr=0.001``."""
    return " ".join(
        f"{k}={'-' if v is None else format(v, '.4g')}"
        for k, v in (values or {}).items()
    )
