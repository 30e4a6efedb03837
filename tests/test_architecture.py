"""The direction of imports: the trainer-neutral core knows nothing of its host.

Every module of ``dp_ckpt_plugin`` outside ``dp_ckpt_plugin/deepmd/`` is core.
The core may not import the deepmd-kit host (``dp_ckpt_plugin.deepmd``), nor
deepmd-kit itself, nor torch or h5py at module level (formats import their
library inside the hook). Imports are read from the source, so an import
inside a function counts too, except for the formats' serialization
libraries.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dp_ckpt_plugin"
HOST = "dp_ckpt_plugin.deepmd"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """Return ``(absolute module, at module level)`` for every import in a file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text("utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module
            found.append((target, id(node) in top))
            found += [
                (f"{target}.{alias.name}", id(node) in top) for alias in node.names
            ]
    return found


CORE = sorted(p for p in PACKAGE.rglob("*.py") if not module_name(p).startswith(HOST))
HOST_FILES = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p).startswith(HOST))


def test_the_split_is_real():
    assert len(CORE) >= 15 and len(HOST_FILES) >= 8


@pytest.mark.parametrize("path", CORE, ids=lambda p: module_name(p))
def test_core_module_imports_nothing_of_the_host(path):
    for target, _ in imports_of(path):
        assert not target.startswith(HOST), f"{module_name(path)} imports {target}"
        assert target.split(".")[0] != "deepmd", (
            f"{module_name(path)} imports deepmd-kit ({target})"
        )


@pytest.mark.parametrize("path", CORE, ids=lambda p: module_name(p))
def test_core_module_imports_no_heavy_library_at_import_time(path):
    for target, top_level in imports_of(path):
        if top_level:
            assert target.split(".")[0] not in {"torch", "h5py"}, (
                f"{module_name(path)} imports {target} at module level"
            )


def test_imports_are_read_correctly():
    """The checker sees a relative import of the host (so the tests above can fail)."""
    takeover = PACKAGE / "deepmd" / "pt_expt" / "train.py"
    targets = {t for t, _ in imports_of(takeover)}
    assert "dp_ckpt_plugin.ranks" in targets
    assert "dp_ckpt_plugin.deepmd.prepare" in targets
    assert "deepmd.pt_expt.entrypoints.main" in targets


def test_host_backends_do_not_import_each_other():
    """A deepmd-kit backend folder (pt_expt, pt) plugs into the shared host only."""
    folders = {p.parent.name for p in HOST_FILES if p.parent != PACKAGE / "deepmd"}
    for path in HOST_FILES:
        if path.parent == PACKAGE / "deepmd":
            continue
        for target, _ in imports_of(path):
            for other in folders - {path.parent.name}:
                assert target != f"{HOST}.{other}" and not target.startswith(
                    f"{HOST}.{other}."
                ), f"{module_name(path)} imports {target}"
