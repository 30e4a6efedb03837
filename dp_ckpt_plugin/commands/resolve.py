"""``dp-ckpt resolve SPEC [--dir D]``: the path ``--restart SPEC`` would use, and why.

``SPEC`` is what ``--restart`` takes: ``latest``, ``best``, ``best:DIR``, a
directory, a file or a prefix; ``--dir`` is the store (the working directory
by default). The same resolution as ``dp-ckpt show D SPEC`` (which stays as
an alias with the store first): the rule that found it (pointer, alias,
newest, file, prefix), how it was checked, and the warnings. Read-only.
``--path`` prints the path alone (for ``$(dp-ckpt resolve latest --path)``):
nothing else on standard output, the warnings on standard error, and when
nothing is found exit status 1 with one line on standard error.
"""

from __future__ import annotations

import argparse

from . import add_digest_flag, flag, show, store_directory

HELP = "print the path --restart SPEC would use, and why"
DESCRIPTION = (
    "Resolve a restart specification (latest, best, best:DIR, a directory, a "
    "file or a prefix) as --restart would, with --dir as the store (the "
    "working directory by default); print the checkpoint found, the rule that "
    "found it, how it was checked and any warnings. Read-only."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``resolve``."""
    parser.add_argument(
        "spec", help="latest, best, best:DIR, a directory, a file or a prefix"
    )
    parser.add_argument(
        "--dir",
        dest="directory",
        metavar="DIR",
        type=store_directory,
        default=".",
        help="the store (save_dir); the working directory by default",
    )
    flag(
        parser,
        "--path",
        "print only the checkpoint's path (warnings go to standard error)",
        dest="path_only",
    )
    add_digest_flag(parser)


#: The same code as ``show``: only the order of the arguments differs.
run = show.run
