"""Count the lines of code of the package, by subpackage.

A line of code holds a token that is neither a comment nor part of a
docstring (the first string statement of a module, class or function);
blank lines do not count. Run it before and after a change::

    python scripts/code_lines.py
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dp_ckpt_plugin"


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers taken by docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        ):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(path: Path) -> int:
    """How many lines of ``path`` hold code."""
    text = path.read_text("utf-8")
    skip = docstring_lines(ast.parse(text))
    ignored = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in ignored:
            continue
        for number in range(token.start[0], token.end[0] + 1):
            if number not in skip:
                lines.add(number)
    return len(lines)


def by_subpackage(package: Path = PACKAGE) -> Counter[str]:
    """Code lines by first folder under the package (``.`` for its top level)."""
    counts: Counter[str] = Counter()
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        counts[parts[0] + "/" if len(parts) > 1 else "."] += code_lines(path)
    return counts


def main() -> int:
    """Print the table and the total."""
    counts = by_subpackage()
    for name in sorted(counts):
        print(f"{name:<14}{counts[name]:>7}")
    print(f"{'total':<14}{sum(counts.values()):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
