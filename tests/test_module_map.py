"""The module map of ``docs/architecture.md`` is the package as it is.

The block between its markers is written by ``scripts/module_map.py``; here it
is written again and compared, and each of its rows is read back and held
against the file it names (its line count, as ``wc -l`` counts) and the
whole package (every module has its row). A module moved, added or grown
fails here until the script runs again.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "module_map.py"
_ROW = re.compile(r"^(?P<indent> *)(?P<name>\S+)\s+(?P<count>\d+)  ")


def load_script():
    spec = importlib.util.spec_from_file_location("module_map", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_holds_what_the_script_writes():
    script = load_script()
    page = script.PAGE.read_text("utf-8")
    assert script.rewritten(page) == page, "run python scripts/module_map.py"


def rows(script) -> dict[Path, int]:
    """Each row of the page's block: the file or folder it names, and its count."""
    page = script.PAGE.read_text("utf-8")
    block = page.split(script.BEGIN, 1)[1].split(script.END, 1)[0]
    found: dict[Path, int] = {}
    folders: list[Path] = []
    for line in block.splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        depth = len(row["indent"]) // 2
        parent = folders[depth - 1] if depth else ROOT
        path = parent / row["name"].rstrip("/")
        if row["name"].endswith("/"):
            folders[depth:] = [path]
        found[path] = int(row["count"])
    return found


def test_every_module_has_its_row_and_true_line_count():
    script = load_script()
    found = rows(script)
    modules = sorted(script.PACKAGE.rglob("*.py"))
    assert sorted(p for p in found if p.suffix == ".py") == modules
    for path in modules:
        assert found[path] == len(path.read_text("utf-8").splitlines()), path
    for folder in (p for p in found if p.suffix != ".py"):
        assert found[folder] == sum(found[p] for p in modules if folder in p.parents)


def test_a_stale_block_is_reported(tmp_path, monkeypatch, capsys):
    script = load_script()
    page = tmp_path / "architecture.md"
    page.write_text(f"# x\n\n{script.BEGIN}\n```\nold\n```\n{script.END}\n")
    monkeypatch.setattr(script, "PAGE", page)
    assert script.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0
    assert "__init__.py" in page.read_text("utf-8")
