"""The ``dp-ckpt`` command: look into, check and tidy a checkpoint store.

::

    dp-ckpt ls models                  # every checkpoint, and what keeps it
    dp-ckpt resolve latest --dir models  # what a restart would use, and why
    dp-ckpt show models [latest|best]  # the same, store first (alias)
    dp-ckpt inspect models/model.ckpt-9.pt  # what one checkpoint holds
    dp-ckpt verify models [--size-only]  # check every checkpoint against its record
    dp-ckpt prune models --dry-run     # what retention removes, then remove it
    dp-ckpt adopt models [--dry-run]   # commit records for plain deepmd-kit files
    dp-ckpt sync models s3://bucket/run   # copy a store, local <-> remote, verified

Every command that takes a store directory also takes the URL of a store on
object storage: ``ls``, ``verify``, ``resolve``/``show``, ``inspect`` and
``prune`` are written once over a store view (``commands.views``) with two
implementations, a directory and a HEAD.

One module per subcommand, each with ``add_arguments(parser)`` and
``run(args) -> int``. The commands know no trainer: they read what a store
says of itself (its manifest, commit records and pointers), so they work on
any store, whoever wrote it. ``--json`` gives a stable, documented form
(``docs/command.md``). A mistake of the user's ends with one line on stderr
and exit status 2 (a usage error) or 1 (a failure), never a traceback.

Importing this package imports nothing heavy; ``rich`` is imported by the
commands that print tables.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import CheckpointError
from ..text import MAX_LOG_LINE, shown

#: The subcommands, each a module of this package.
SUBCOMMANDS = (
    "ls",
    "resolve",
    "show",
    "inspect",
    "diff",
    "check",
    "verify",
    "prune",
    "adopt",
    "sync",
)
#: Exit status of a failure (a corrupt checkpoint, a held lock, nothing found).
FAILURE = 1
#: Exit status of a usage error (an unknown option, a directory that is not one).
USAGE = 2


class UsageError(Exception):
    """A mistake in the command line; exit status 2."""

    @classmethod
    @contextlib.contextmanager
    def on(cls, *kinds: type[Exception], prefix: str = "") -> Iterator[None]:
        """An exception of ``kinds`` raised inside as a usage error, its message
        after ``prefix``."""
        try:
            yield
        except kinds as exc:
            raise cls(f"{prefix}{exc}") from None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def is_remote(value: object) -> bool:
    """Whether a command-line value names a store on object storage.

    Raises
    ------
    UsageError
        For a mistyped URL (``s3:/bucket/run``), saying what was meant.
    """
    from ..objectstore.registry import check_not_mistyped, local_path

    with UsageError.on(CheckpointError):
        check_not_mistyped(value)
        return isinstance(value, str) and local_path(value) is None


def store_directory(value: str) -> Path | str:
    """An argument naming an existing store directory (or a remote store's URL)."""
    from ..objectstore.registry import local_path

    if is_remote(value):
        return value  # read when the command runs
    return existing(value, Path(local_path(value)), files=False)


def existing(value: str, path: Path, *, files: bool) -> Path:
    """``path``, which ``value`` names, when it is a directory (or with
    ``files`` a file); else the argument error saying what it should be."""
    from ..errors import UnreadableFileError
    from ..storage import default_storage

    try:
        found = default_storage().entry(path, follow=True)
    except UnreadableFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if found is None:
        what = "file or directory" if files else "directory"
        raise argparse.ArgumentTypeError(f"{value}: no such {what}")
    if not (found.is_dir or (files and found.is_file)):
        what = "a file or a directory" if files else "a directory"
        raise argparse.ArgumentTypeError(f"{value} is not {what}")
    return path


def at_least(
    kind: Callable[[str], Any], low: float, expected: str
) -> Callable[[str], Any]:
    """An argument type: a number read by ``kind``, ``low`` or more (NaN is not).

    ``kind`` is ``int``, ``float`` or a parser that refuses a value in its own
    words (``argparse.ArgumentTypeError``); ``None`` from it is refused here.
    """

    def parse(value: str):
        try:
            found = kind(value)
        except ValueError:
            found = None
        if found is None or not found >= low:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
        return found

    return parse


class _Sha256(argparse.Action):
    """``--sha256``, 0.2's spelling of ``--digest``: refused in one line."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(
            f"{option_string} is --digest (records name their algorithm) since 0.3"
        )


def refuse_sha256(parser: argparse.ArgumentParser) -> None:
    """``--sha256``: refused in one line naming ``--digest``."""
    parser.add_argument("--sha256", nargs=0, action=_Sha256, help=argparse.SUPPRESS)


def flag(parser, name: str, help: str, dest: str | None = None) -> None:
    """A yes-or-no option (``store_true``) of ``parser`` or one of its groups."""
    parser.add_argument(name, dest=dest, action="store_true", help=help)


def add_digest_flag(parser: argparse.ArgumentParser) -> None:
    """``--digest``: re-read files and compare digests (``--sha256`` refused)."""
    refuse_sha256(parser)
    flag(
        parser,
        "--digest",
        "also re-read each file and compare its digest with its commit "
        "record (the size is always compared)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``dp-ckpt`` and its subcommands."""
    parser = _Parser(
        prog="dp-ckpt",
        description="Look into, check and tidy a dp_ckpt_plugin checkpoint store.",
    )
    parser.add_argument("--version", action="version", version=f"dp-ckpt {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    subparsers.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f".{name}", __name__)
        sub = subparsers.add_parser(
            name, help=module.HELP, description=module.DESCRIPTION
        )
        flag(sub, "--json", "print JSON (see docs/command.md)")
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``dp-ckpt``; return its exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; ``sys.argv[1:]`` by default.
    """
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        return _fail(exc, USAGE)
    except BrokenPipeError:  # `dp-ckpt ls D | head`: the reader is gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILURE
    except (CheckpointError, OSError) as exc:
        return _fail(exc, FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def _fail(message: object, status: int) -> int:
    sys.stderr.write(f"dp-ckpt: error: {shown(one_line(str(message)), MAX_LOG_LINE)}\n")
    return status


def one_line(text: str) -> str:
    """A message of several lines (a list of places looked at) as one line."""
    parts = [line.strip().removeprefix("- ") for line in text.splitlines()]
    out = ""
    for part in filter(None, parts):
        out += part if not out else (" " if out.endswith(":") else "; ") + part
    return out


def entry_point() -> None:
    """The ``dp-ckpt`` console script."""
    sys.exit(main())
