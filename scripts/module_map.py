"""Write the module map of ``docs/architecture.md`` from the package itself.

Every module of ``dp_ckpt_plugin`` with its line count (``wc -l``) and the
first paragraph of its docstring, folder by folder, between the markers of
the page. Run it after moving, adding or changing a module::

    python scripts/module_map.py          # rewrite the block
    python scripts/module_map.py --check  # exit 1 if the block is stale

``tests/test_module_map.py`` fails when the page's block is not what this
writes.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dp_ckpt_plugin"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module map: written by scripts/module_map.py, do not edit -->"
END = "<!-- end of module map -->"
#: Width of the name and count columns, and of a whole line.
NAME, COUNT, WIDTH = 26, 5, 110


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line, as plain text."""
    doc = ast.get_docstring(ast.parse(path.read_text("utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?\.*([^`]+)`", r"\1", text)  # :mod:`..x` is x
    return re.sub(r"``([^`]+)``", r"\1", text)


def lines(path: Path) -> int:
    """What ``wc -l`` says: the number of newlines."""
    return path.read_bytes().count(b"\n")


def row(indent: int, name: str, count: int | None, text: str) -> list[str]:
    """One entry: name, count, and its summary wrapped under itself."""
    head = f"{' ' * indent}{name}"
    number = "" if count is None else str(count)
    start = f"{head:<{NAME}}{number:>{COUNT}}  "
    if len(head) >= NAME:  # a long name: the count and text go after it
        start = f"{head} {number:>{COUNT}}  "
    body = textwrap.wrap(text, WIDTH - NAME - COUNT - 2) or [""]
    return [start + body[0], *(" " * (NAME + COUNT + 2) + more for more in body[1:])]


def folder_rows(folder: Path, indent: int) -> list[str]:
    """A folder's modules, then its subfolders, each by name."""
    out = []
    files = sorted(p for p in folder.glob("*.py"))
    for path in files:
        out += row(indent, path.name, lines(path), summary(path))
    for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
        total = sum(lines(p) for p in sub.rglob("*.py"))
        out += row(indent, f"{sub.name}/", total, summary(sub / "__init__.py"))
        out += folder_rows(sub, indent + 2)
    return out


def module_map() -> str:
    """The block between the markers: a fenced listing of the whole package."""
    total = sum(lines(p) for p in PACKAGE.rglob("*.py"))
    rows = row(0, f"{PACKAGE.name}/", total, summary(PACKAGE / "__init__.py"))
    rows += folder_rows(PACKAGE, 2)
    return "\n".join(["```", *rows, "```"])


def rewritten(page: str) -> str:
    """``page`` with the block between its markers written anew."""
    before, begin, rest = page.partition(BEGIN)
    _, end, after = rest.partition(END)
    if not (begin and end):
        raise SystemExit(f"{PAGE.name} lacks the markers {BEGIN!r} and {END!r}")
    return f"{before}{BEGIN}\n{module_map()}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say if stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text("utf-8")
    new = rewritten(page)
    if args.check:
        if new != page:
            print(f"{PAGE} is stale: run python scripts/module_map.py")
            return 1
        return 0
    if new != page:
        PAGE.write_text(new, "utf-8")
        print(f"wrote the module map of {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
