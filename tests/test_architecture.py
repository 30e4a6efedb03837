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


# -- the storage layer and the hook facade --------------------------------------

#: The only core modules that may touch the file system.
STORAGE = "dp_ckpt_plugin.storage"
#: The only module that may call a hook (``pm.hook.<name>``).
FACADE = "dp_ckpt_plugin.hooks"
#: ``os`` functions that touch the file system (by name, as ``os.<name>``).
OS_CALLS = {
    "open",
    "fdopen",
    "replace",
    "rename",
    "renames",
    "unlink",
    "remove",
    "fsync",
    "fdatasync",
    "scandir",
    "listdir",
    "walk",
    "stat",
    "lstat",
    "readlink",
    "symlink",
    "link",
    "mkdir",
    "makedirs",
    "rmdir",
    "removedirs",
    "chmod",
    "chown",
    "utime",
    "truncate",
    "access",
    "statvfs",
    "mkfifo",
    "mknod",
}
#: ``os.path`` functions that touch the file system.
OS_PATH_CALLS = {
    "exists",
    "lexists",
    "isfile",
    "isdir",
    "islink",
    "ismount",
    "realpath",
    "getsize",
    "getmtime",
    "getatime",
    "getctime",
    "samefile",
    "sameopenfile",
}
#: Methods of ``pathlib.Path`` that touch the file system.
PATH_METHODS = {
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "exists",
    "is_file",
    "is_dir",
    "is_symlink",
    "is_mount",
    "is_fifo",
    "is_socket",
    "iterdir",
    "glob",
    "rglob",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "touch",
    "stat",
    "lstat",
    "resolve",
    "symlink_to",
    "hardlink_to",
    "readlink",
    "samefile",
    "open",
    "chmod",
}
#: Modules whose whole purpose is a library's own I/O on a path the store gives.
LIBRARY_IO = {"shutil", "tempfile", "glob"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def file_system_calls(path: Path) -> list[str]:
    """Every call in ``path`` that touches the file system outside a storage."""
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _dotted(func)
        where = f"{module_name(path)}:{node.lineno} {name}(...)"
        if isinstance(func, ast.Name) and func.id == "open":
            found.append(where)
        elif not isinstance(func, ast.Attribute):
            continue
        elif name.split(".")[0] in LIBRARY_IO or (
            name.startswith("os.path.") and func.attr in OS_PATH_CALLS
        ):
            found.append(where)
        elif name == f"os.{func.attr}" and func.attr in OS_CALLS:
            if (
                func.attr == "open"
                and node.args
                and _dotted(node.args[0]) == "os.devnull"
            ):
                continue  # silencing a closed standard output, not a file of ours
            found.append(where)
        elif func.attr in PATH_METHODS and _looks_like_path_call(func, node):
            found.append(where)
    return found


def _looks_like_path_call(func: ast.Attribute, node: ast.Call) -> bool:
    """Whether ``<x>.<method>(...)`` may be a ``Path`` method, not a namesake.

    A storage's own methods are what the rule asks for; ``str.replace`` and
    ``dataclasses.replace`` take other arguments than ``Path.replace``; a
    store resolves a specification, ``Path.resolve`` takes none; an object
    opening itself (``self.open()``) is not a file.
    """
    receiver = _dotted(func.value)
    if receiver.endswith("storage") or receiver == "dataclasses":
        return False
    if func.attr == "replace":
        return len(node.args) == 1 and not node.keywords
    if func.attr == "resolve":
        return not node.args
    return not (func.attr == "open" and receiver == "self")


def hook_calls(path: Path) -> list[str]:
    """Every use of ``<manager>.hook`` (or pluggy's hook machinery) in ``path``."""
    tree = ast.parse(path.read_text("utf-8"))
    return [
        f"{module_name(path)}:{node.lineno} {_dotted(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in {"hook", "subset_hook_caller", "get_hookimpls"}
    ]


OUTSIDE_STORAGE = [p for p in CORE if not module_name(p).startswith(STORAGE)]


@pytest.mark.parametrize("path", OUTSIDE_STORAGE, ids=lambda p: module_name(p))
def test_only_the_storage_layer_touches_the_file_system(path):
    assert file_system_calls(path) == []


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p)
)
def test_hooks_are_called_only_through_the_facade(path):
    if module_name(path) == FACADE:
        return
    assert hook_calls(path) == []


def test_the_checkers_see_what_they_look_for(tmp_path):
    """The two checkers report a file-system call and a raw hook call (so they can fail)."""
    sample = PACKAGE / "sample_for_the_checker.py"
    text = (
        "import os, shutil\nfrom pathlib import Path\n"
        "def f(pm, storage, p):\n"
        "    open(p)\n    os.replace(p, p)\n    os.path.isfile(p)\n"
        "    Path(p).read_text()\n    shutil.copy(p, p)\n"
        "    storage.rename(p, p)\n    os.path.join(p, p)\n"
        "    pm.hook.on_commit()\n"
    )
    sample.write_text(text)
    try:
        calls = file_system_calls(sample)
        hooks = hook_calls(sample)
    finally:
        sample.unlink()
    assert [c.split(" ")[1] for c in calls] == [
        "open(...)",
        "os.replace(...)",
        "os.path.isfile(...)",
        "Path(p).read_text(...)".replace("Path(p)", "?"),
        "shutil.copy(...)",
    ]
    assert len(hooks) == 1


def test_the_store_reads_in_one_sitting():
    """The store stays small (about 300 lines of code besides its docstrings):
    writing, publishing, pruning, resuming and describing live in their own
    modules."""
    source = (PACKAGE / "store.py").read_text("utf-8")
    tree = ast.parse(source)
    documented = [
        node.body[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and ast.get_docstring(node)
    ]
    docs = sum(d.end_lineno - d.lineno + 1 for d in documented)
    code = source.count("\n") - docs
    assert code <= 310, f"store.py has {code} lines besides its docstrings"
