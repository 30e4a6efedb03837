"""The seams of the package, read from its source.

- **What may touch the file system and the operating system**, module by
  module (:data:`ALLOWED`, below). The storage layer may touch anything;
  every other module only what its entry names, each with the reason: the
  host's calls into deepmd-kit one by one, torch's and h5py's serializers
  where they read or write a handle the storage opened, the process's own
  signals, environment and children. A module that is not in the table may
  touch nothing. Imports are resolved (``import os as o``, ``from os import
  replace as r``), so an alias is no way round; ``getattr(os, ...)``,
  ``importlib.import_module`` and star imports count too.
- **The direction of imports**: the trainer-neutral core (every module
  outside ``deepmd/``) imports nothing of the deepmd-kit host nor deepmd-kit
  itself, and no heavy library (torch, h5py) at module level; a host backend
  folder never imports another.
- **One hook facade**: only :mod:`dp_ckpt_plugin.plugin.hooks` calls ``pm.hook``.

The checkers are shown to catch every kind of escape they look for on a
package planted in a temporary directory (:func:`test_every_kind_of_escape_is_caught`).

When modules move, the table's keys move with them: a key that names no
module fails (:func:`test_the_table_names_modules_that_exist`), and so does
an allowance its module no longer uses.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dp_ckpt_plugin"
HOST = "dp_ckpt_plugin.deepmd"

#: What a module may touch of the file system and the operating system, by its
#: path in the package (a key ending in ``/`` covers a whole folder), each
#: touch with why. ``*`` allows everything. A module not listed touches nothing.
ALLOWED: dict[str, dict[str, str]] = {
    # -- the storage layer ----------------------------------------------------
    "storage/": {"*": "the storage layer: the one place files are touched"},
    "objectstore/cloud.py": {
        "os.environ": "the variables an S3, GCS or Azure client reads (endpoint, "
        "region, profile), read once when the storage is built",
        "os.SEEK_END": "the size of an open file it is handed to upload",
    },
    # -- the core -----------------------------------------------------------
    "__init__.py": {
        "importlib.import_module": "public names load their own module on first use",
    },
    "blocklist.py": {"os.environ": "the plugin block list (DP_CKPT_DISABLE_PLUGINS)"},
    "plugin/__init__.py": {
        "importlib.import_module": "the built-in plugins, by module name",
    },
    "remote/lease.py": {
        "os.getpid": "the lease names its holder's process",
        "os.kill": "whether a holder of this host is still alive (signal 0)",
        "socket.gethostname": "the lease names its holder's host",
    },
    "remote/probe.py": {"os.getpid": "a probe's key names its writer"},
    "store/lock.py": {
        "os.getpid": "the holder note names this process",
        "socket.gethostname": "the holder note names this host",
    },
    "background/snapshot.py": {"os.environ": "DP_CKPT_CUDA_COPY"},
    "background/shm.py": {
        "os.memfd_create": "snapshot buffers in anonymous shared memory, no file",
        "os.MFD_CLOEXEC": "snapshot buffers in anonymous shared memory, no file",
        "os.ftruncate": "sizing an anonymous shared buffer",
        "os.close": "closing an anonymous shared buffer",
        "mmap.mmap": "mapping an anonymous shared buffer",
    },
    "background/process.py": {
        "multiprocessing.connection": "the message pipe to the writer process",
        "multiprocessing.reduction": "hands buffers' descriptors to the writer process",
        "subprocess.Popen": "starts the writer process",
        "subprocess.DEVNULL": "starts the writer process",
        "subprocess.TimeoutExpired": "waits for the writer process to leave",
        "socket.socketpair": "the writer process's two sockets",
        "socket.socket": "the writer process's sockets (a type)",
        "os.environ": "DP_CKPT_WRITER, and the child's environment",
    },
    "background/child.py": {
        "multiprocessing.connection": "the message pipe to its parent",
        "multiprocessing.reduction": "receives the shared buffers' descriptors",
        "torch.*": "a dtype by its name (getattr(torch, 'float32'))",
        "socket.socket": "the socket its parent handed over",
        "mmap.mmap": "maps the shared buffers its parent sends",
        "os.close": "closes a received buffer once mapped",
        "signal.signal": "ignores SIGINT (its parent decides when it ends)",
        "signal.SIGINT": "ignores SIGINT (its parent decides when it ends)",
        "signal.SIG_IGN": "ignores SIGINT (its parent decides when it ends)",
    },
    "formats/torch.py": {
        "torch.save": "into the file the storage created (its handle, or the "
        "os_path naming that open file)",
        "torch.load": "from the handle holding the bytes the storage read",
    },
    "formats/hdf5.py": {"h5py.File": "on the handle the storage opened"},
    "formats/checksums.py": {
        "zipfile.ZipFile": "reads the members of bytes the storage read (in memory)",
        "zipfile.BadZipFile": "what a damaged archive in memory raises",
        "h5py.File": "on the bytes the storage read (in memory)",
        "pathlib.Path.open": "ZipFile.open of a member of the archive in memory, "
        "read like Path.open by this checker",
    },
    "commands/__init__.py": {
        "importlib.import_module": "one module per subcommand, loaded on use",
        "os.dup2": "silences a closed standard output (not a file of the store)",
        "os.open": "opens os.devnull to silence a closed standard output",
        "os.devnull": "silences a closed standard output",
        "os.O_WRONLY": "silences a closed standard output",
    },
    # -- the deepmd-kit host -------------------------------------------------
    "deepmd/takeover.py": {
        "deepmd.__version__": "the version guard",
        "deepmd.backend.backend.Backend.register": "registers the plugin as "
        "deepmd-kit's --pt and --pt-expt backends",
        "importlib.import_module": "deepmd-kit's own backend, when the plugin is off",
        "os.environ": "DP_CKPT_DISABLE",
    },
    "deepmd/host.py": {
        "importlib.import_module": "a host folder's modules, by the descriptor's names",
    },
    "deepmd/cli.py": {
        "deepmd.main.parse_args": "deepmd-kit's command line",
        "deepmd.loggers.loggers.set_log_handles": "deepmd-kit's log file",
        "importlib.import_module": "deepmd-kit's backend entry point (main, "
        "change_bias), named by the host descriptor",
        "os.environ": "LOCAL_RANK (torchrun) and DP_CKPT_ALLOW_FALLBACK",
        "os.kill": "ends the process by SIGINT once the store is closed",
        "os.getpid": "ends the process by SIGINT once the store is closed",
        "signal.signal": "ends the process by SIGINT once the store is closed",
        "signal.pthread_sigmask": "ends the process by SIGINT once the store is closed",
        "signal.SIGINT": "Ctrl-C ends the command by SIGINT",
        "signal.SIG_DFL": "ends the process by SIGINT once the store is closed",
        "signal.SIG_UNBLOCK": "ends the process by SIGINT once the store is closed",
    },
    "deepmd/logs.py": {
        "deepmd.__version__": "deepmd-kit's version line, said as its main says it",
    },
    "deepmd/argcheck.py": {
        "signal.Signals": "the names of stop signals",
    },
    "deepmd/prepare.py": {
        "deepmd.common.j_loader": "reads the training input as deepmd-kit does",
    },
    "deepmd/preempt.py": {
        "signal.Signals": "the stop signals",
        "signal.signal": "installs and restores the stop-signal handlers",
        "signal.getsignal": "keeps a SIGINT the shell ignores ignored",
        "signal.SIGINT": "Ctrl-C is a stop signal",
        "signal.SIG_IGN": "keeps a SIGINT the shell ignores ignored; workers ignore",
        "signal.default_int_handler": "a second Ctrl-C aborts",
    },
    "deepmd/origin.py": {
        "deepmd.utils.argcheck.normalize": "the input as deepmd-kit normalizes it "
        "(no file written)",
        "deepmd.utils.compat.update_deepmd_input": "the input as deepmd-kit "
        "normalizes it (no dump file)",
    },
    "deepmd/exact.py": {
        "torch.load": "reads the plugin's entry from the verified bytes",
        "deepmd.utils.random._RANDOM_GENERATOR": "deepmd-kit's random generator "
        "(dp_random), captured and restored",
        "deepmd.utils.random.seed": "seeds dp_random from training.seed",
    },
    "deepmd/heads.py": {
        "torch.load": "reads the model parameters from the verified bytes",
    },
    "deepmd/adopt.py": {
        "torch.load": "checks that the bytes read once load",
    },
    "deepmd/loading.py": {
        "torch.load": "serves deepmd-kit's torch.load of a verified checkpoint "
        "from the bytes read once",
        "torch.serialization.load": "torch's own load, for any other file",
    },
    "deepmd/checkpointing.py": {
        "torch.save": "into a file the storage created (files outside the store)",
    },
    "deepmd/runtime.py": {
        "os.environ": "torchrun's variables (LOCAL_RANK, WORLD_SIZE, ...)",
        "builtins.open": "the state of torch's gloo threads in /proc/self/task "
        "(no file of a store)",
        "os.listdir": "the threads of this process in /proc/self/task",
    },
    "deepmd/pt_expt/train.py": {
        "deepmd.pt_expt.entrypoints.main.PTExptTrainEntrypoint": "deepmd-kit's "
        "pt_expt training pipeline, run with the steps overridden",
        "deepmd.pt_expt.train.training": "its Trainer, replaced while training",
        "deepmd.dpmodel.train.entrypoint.TrainEntrypointOptions": "the pipeline's "
        "options",
    },
    "deepmd/pt_expt/trainer.py": {
        "deepmd.pt_expt.train.training.Trainer": "deepmd-kit's pt_expt Trainer, "
        "subclassed",
        "deepmd.pt_expt.train.training._CompiledModel": "unwrapped while the "
        "payload is assembled",
        "deepmd.pt_expt.train.ema.EMA_CHECKPOINT_KEY": "the EMA key of the payload",
    },
    "deepmd/pt_expt/freeze.py": {
        "deepmd.pt_expt.entrypoints.main.freeze": "deepmd-kit's pt_expt freeze",
    },
    "deepmd/pt/train.py": {
        "deepmd.pt.entrypoints.main": "deepmd-kit's dp --pt train, j_loader and "
        "dist, run with the trainer replaced",
        "deepmd.pt.entrypoints.main.train": "deepmd-kit's dp --pt train",
        "deepmd.pt.entrypoints.main.j_loader": "reads the input as deepmd-kit does",
        "deepmd.pt.entrypoints.main.dist": "deepmd-kit's process group, kept",
        "deepmd.pt.train.training": "its Trainer and DataLoader, replaced while "
        "training",
        "deepmd.pt.train.training.DataLoader": "deepmd-kit's DataLoader, its "
        "workers made to ignore stop signals",
        "signal.Signals": "the stop signals the workers ignore",
    },
    "deepmd/pt/trainer.py": {
        "deepmd.pt.train.training.Trainer": "deepmd-kit's dp --pt Trainer, subclassed",
        "deepmd.pt.train.training.DDP": "built the CPU way under torchrun",
    },
    "deepmd/pt/freeze.py": {
        "deepmd.pt.entrypoints.main.freeze": "deepmd-kit's dp --pt freeze",
    },
    "deepmd/pt/batches.py": {
        "deepmd.pt.utils.dataloader.DpLoaderSet": "the data set whose position "
        "is saved",
    },
}


# -- reading a module ---------------------------------------------------------------

#: Modules every member of which touches the file system or the OS.
WHOLE = {
    "os",
    "os.path",
    "shutil",
    "fcntl",
    "mmap",
    "zipfile",
    "tarfile",
    "subprocess",
    "signal",
    "socket",
    "tempfile",
    "glob",
    "ctypes",
    "multiprocessing",
}
#: Members of other modules that do.
MEMBERS = {
    "builtins": {"open", "__import__"},
    "io": {"open", "open_code", "FileIO"},
    "importlib": {"import_module", "__import__"},
    "torch": {"load", "save"},
    "torch.serialization": {"load", "save"},
    "torch.jit": {"load", "save"},
    "h5py": {"File"},
    "numpy": {
        "load",
        "save",
        "savez",
        "savez_compressed",
        "savetxt",
        "loadtxt",
        "genfromtxt",
        "fromfile",
        "memmap",
    },
}
#: What touches nothing: path arithmetic and constants.
PURE = {
    "os.path.join",
    "os.path.split",
    "os.path.splitext",
    "os.path.basename",
    "os.path.dirname",
    "os.path.normpath",
    "os.path.normcase",
    "os.path.relpath",
    "os.path.abspath",
    "os.path.isabs",
    "os.path.commonpath",
    "os.path.commonprefix",
    "os.path.sep",
    "os.sep",
    "os.pardir",
    "os.curdir",
    "os.extsep",
    "os.altsep",
    "os.linesep",
    "os.fspath",
    "os.fsencode",
    "os.fsdecode",
    "os.PathLike",
    "os.getcwd",  # the process's working directory, no file
    "os.path",  # the module itself, as ``import os.path`` binds it
}
#: What ``pathlib`` holds that is no I/O: its classes (``Path``'s own I/O is
#: :data:`PATH_METHODS`).
PATHLIB_CLASSES = {
    "Path",
    "PurePath",
    "PosixPath",
    "WindowsPath",
    "PurePosixPath",
    "PureWindowsPath",
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
    "is_block_device",
    "is_char_device",
    "iterdir",
    "glob",
    "rglob",
    "walk",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "touch",
    "stat",
    "lstat",
    "resolve",
    "readlink",
    "symlink_to",
    "hardlink_to",
    "samefile",
    "open",
    "chmod",
    "lchmod",
    "expanduser",
}
#: Receivers whose namesake methods are not ``Path``'s (a storage's are the rule).
NOT_PATHS = {"storage", "store", "self", "dataclasses", "hooks", "lock", "_lock"}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def table_key(path: Path, package: Path = PACKAGE) -> str:
    return path.relative_to(package).as_posix()


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def aliases(tree: ast.Module, package: str) -> dict[str, str]:
    """What each name bound by an import means, as an absolute dotted name.

    Imports anywhere in the module count (inside functions too).
    """
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    found[head] = head
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, node.module] if node.module else parts)
            for alias in node.names:
                found[alias.asname or alias.name] = f"{base}.{alias.name}"
    return found


def _canonical(name: str, names: dict[str, str]) -> str | None:
    """``name`` as an absolute dotted name, through the module's imports."""
    head, _, rest = name.partition(".")
    if head in names:
        return names[head] + (f".{rest}" if rest else "")
    if head in {"open", "__import__"}:
        return f"builtins.{name}"
    return None


def touch_of(dotted: str, binding: str | None = None) -> str | None:
    """The touch an absolute dotted name makes, as the table names it, or ``None``.

    ``binding`` is what the import bound (a deepmd-kit name is named by it
    and at most one attribute more: ``deepmd.pt.train.training.Trainer``).
    """
    parts = dotted.split(".")
    if parts[0] == "deepmd":
        keep = len((binding or dotted).split(".")) + 1
        return ".".join(parts[:keep])
    if dotted in PURE:
        return None
    for cut in range(len(parts) - 1, 0, -1):
        module, member = ".".join(parts[:cut]), parts[cut:]
        if module in WHOLE:
            touched = f"{module}.{member[0]}"
            return None if touched in PURE else touched
        if module == "pathlib":
            if member[0] not in PATHLIB_CLASSES:
                return f"pathlib.{member[0]}"
            if len(member) > 1 and member[1] in PATH_METHODS:
                return f"pathlib.{member[0]}.{member[1]}"
            return None
        if module in MEMBERS:
            for length in (2, 1):
                wanted = ".".join(member[:length])
                if len(member) >= length and wanted in MEMBERS[module]:
                    return f"{module}.{wanted}"
            return None
    return None


def _locals(function: ast.AST) -> set[str]:
    """Names a function binds itself (parameters, assignments), not by an import."""
    found: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return found - imported


class _Reader(ast.NodeVisitor):
    """Walks a module, each name read in the scope that binds it."""

    def __init__(self, names: dict[str, str], module_locals: set[str]) -> None:
        self.names = names
        self.scopes = [module_locals]
        self.found: dict[str, int] = {}
        self.handled: set[int] = set()

    def note(self, touch: str | None, node: ast.AST) -> None:
        if touch is not None:
            self.found.setdefault(touch, node.lineno)

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.scopes.append(_locals(node))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if any(a.name == "*" for a in node.names):
            self.note(touch_of(f"{self.names['*'].rpartition('.')[0]}.*"), node)

    def visit_Call(self, node: ast.Call) -> None:
        self.note(_dynamic(node, self.names, self.handled), node)
        self.note(_path_method(node, self.names), node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not self.chain(node):
            self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self.chain(node)

    def chain(self, node: ast.AST) -> bool:
        """Note the touch a whole ``a.b.c`` chain makes; whether it was one."""
        dotted = _dotted(node)
        if dotted is None:
            return False
        head = dotted.partition(".")[0]
        if id(node) in self.handled or any(head in scope for scope in self.scopes):
            return True  # named by getattr; or a local name, not the import's
        canonical = _canonical(dotted, self.names)
        if canonical is not None:
            self.note(touch_of(canonical, self.names.get(head)), node)
        return True


def touches(path: Path, package: Path = PACKAGE) -> dict[str, int]:
    """Every touch of the file system or the OS in ``path``: name to first line.

    Every name is read through the module's imports (an alias is its
    module's name); a name a function binds itself (a parameter called
    ``training``) is that function's, not the import's.
    """
    name = module_name(path, package)
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text("utf-8"))
    names = aliases(tree, base)
    shadowing = {
        n.id
        for top in tree.body
        if not isinstance(top, ast.FunctionDef | ast.ClassDef)
        for n in ast.walk(top)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    shadowing |= {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
    }
    reader = _Reader(names, shadowing - set(names))
    reader.visit(tree)
    return reader.found


def _dynamic(node: ast.Call, names: dict[str, str], handled: set[int]) -> str | None:
    """``getattr(os, "replace")`` is ``os.replace``; ``getattr(os, name)`` is ``os.*``."""
    if not (isinstance(node.func, ast.Name) and node.func.id == "getattr"):
        return None
    target = _dotted(node.args[0]) if node.args else None
    canonical = _canonical(target, names) if target else None
    if canonical is None:
        return None
    handled.add(id(node.args[0]))  # named here, with its attribute
    attr = node.args[1] if len(node.args) > 1 else None
    if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
        return touch_of(f"{canonical}.{attr.value}", names.get(target.split(".")[0]))
    if canonical.split(".")[0] == "deepmd" or canonical in WHOLE | set(MEMBERS):
        return f"{canonical}.*"
    return None


def _path_method(node: ast.Call, names: dict[str, str]) -> str | None:
    """``<x>.read_text()`` and its kind: a ``Path`` method, unless a namesake.

    A storage's own methods are what the rule asks for; a module's function
    of the same name (``os.open``) is named through its import;
    ``str.replace`` and ``dataclasses.replace`` take other arguments than
    ``Path.replace``; a store resolves a specification, ``Path.resolve``
    takes none; an object opening itself (``self.open()``, ``store.open()``)
    is not a file.
    """
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in PATH_METHODS:
        return None
    receiver = _dotted(func.value) or "?"
    last = receiver.rpartition(".")[2]
    if last in NOT_PATHS or last.endswith(("storage", "store")):
        return None
    imported = _canonical(receiver, names)
    if imported is not None and not imported.startswith("pathlib"):
        return None
    if func.attr == "replace" and (len(node.args) != 1 or node.keywords):
        return None
    if func.attr == "resolve" and node.args:
        return None
    return f"pathlib.Path.{func.attr}"


def allowed_for(key: str, table: dict[str, dict[str, str]]) -> dict[str, str]:
    """What the table allows the module at ``key`` (its own entry and its folders')."""
    allowed = dict(table.get(key, {}))
    for folder, entry in table.items():
        if folder.endswith("/") and key.startswith(folder):
            allowed.update(entry)
    return allowed


def escapes(path: Path, table: dict[str, dict[str, str]], package: Path = PACKAGE):
    """The touches of ``path`` its entry does not allow: ``module:line touch``."""
    allowed = allowed_for(table_key(path, package), table)
    if "*" in allowed:
        return []
    return [
        f"{module_name(path, package)}:{line} {touch}"
        for touch, line in sorted(touches(path, package).items())
        if touch not in allowed
    ]


MODULES = sorted(PACKAGE.rglob("*.py"))
CORE = [p for p in MODULES if not module_name(p).startswith(HOST)]
HOST_FILES = [p for p in MODULES if module_name(p).startswith(HOST)]


# -- what may touch the file system and the OS ---------------------------------------


@pytest.mark.parametrize("path", MODULES, ids=lambda p: table_key(p))
def test_a_module_touches_only_what_its_entry_allows(path):
    assert escapes(path, ALLOWED) == []


def test_the_table_names_modules_that_exist():
    """A key names a module or a folder of the package (rename it with its file)."""
    keys = {table_key(p) for p in MODULES}
    folders = {f"{p.parent.relative_to(PACKAGE).as_posix()}/" for p in MODULES}
    stale = [k for k in ALLOWED if k not in keys and k not in folders]
    assert stale == [], f"the table names modules that do not exist: {stale}"


@pytest.mark.parametrize(
    "key", [k for k in ALLOWED if not k.endswith("/")], ids=lambda k: k
)
def test_every_allowance_is_used(key):
    """The table says what each module does, no more: an unused allowance goes."""
    used = touches(PACKAGE / key)
    assert sorted(set(ALLOWED[key]) - set(used)) == []


def test_the_whole_package_is_read():
    """The core, the commands and the deepmd-kit host are all checked."""
    keys = {table_key(p) for p in MODULES}
    assert {"store/lock.py", "commands/inspect.py", "deepmd/prepare.py"} <= keys
    assert {"deepmd/pt/trainer.py", "deepmd/pt_expt/trainer.py"} <= keys
    assert len(CORE) >= 40 and len(HOST_FILES) >= 25


#: One escape of each kind, as a module of a planted package, and what it is called.
ESCAPES = {
    "builtin_open": ("def f(p):\n    return open(p)\n", "builtins.open"),
    "os_call": ("import os\ndef f(p):\n    os.replace(p, p)\n", "os.replace"),
    "os_alias": ("import os as o\ndef f(p):\n    o.unlink(p)\n", "os.unlink"),
    "from_os_alias": (
        "from os import replace as r\ndef f(p):\n    r(p, p)\n",
        "os.replace",
    ),
    "os_path": ("import os.path\ndef f(p):\n    os.path.isfile(p)\n", "os.path.isfile"),
    "os_path_alias": (
        "from os import path as osp\ndef f(p):\n    osp.exists(p)\n",
        "os.path.exists",
    ),
    "os_reference": ("import os\nremove = os.remove\n", "os.remove"),
    "os_environ": ("import os\nos.environ['X'] = '1'\n", "os.environ"),
    "getattr_os": (
        "import os\ndef f(p):\n    getattr(os, 'rmdir')(p)\n",
        "os.rmdir",
    ),
    "getattr_os_dynamic": (
        "import os\ndef f(p, n):\n    getattr(os, n)(p)\n",
        "os.*",
    ),
    "star_import": ("from os import *\n", "os.*"),
    "inner_import": (
        "def f(p):\n    import shutil as s\n    s.rmtree(p)\n",
        "shutil.rmtree",
    ),
    "pathlib_method": (
        "from pathlib import Path\ndef f(p):\n    return Path(p).read_text()\n",
        "pathlib.Path.read_text",
    ),
    "pathlib_alias": (
        "from pathlib import Path as P\ndef f(p):\n    P(p).unlink()\n",
        "pathlib.Path.unlink",
    ),
    "pathlib_through_module": (
        "import pathlib\ndef f(p):\n    pathlib.os.replace(p, p)\n",
        "pathlib.os",
    ),
    "io_open": ("import io\ndef f(p):\n    return io.open(p)\n", "io.open"),
    "fcntl": ("import fcntl\ndef f(fd):\n    fcntl.flock(fd, 2)\n", "fcntl.flock"),
    "mmap": (
        "from mmap import mmap\ndef f(fd):\n    return mmap(fd, 0)\n",
        "mmap.mmap",
    ),
    "zipfile": (
        "import zipfile\ndef f(p):\n    return zipfile.ZipFile(p)\n",
        "zipfile.ZipFile",
    ),
    "tarfile": (
        "import tarfile\ndef f(p):\n    return tarfile.open(p)\n",
        "tarfile.open",
    ),
    "torch_load": (
        "def f(p):\n    import torch\n    return torch.load(p)\n",
        "torch.load",
    ),
    "torch_save_alias": (
        "from torch import save as keep\ndef f(x, p):\n    keep(x, p)\n",
        "torch.save",
    ),
    "torch_jit": (
        "import torch\ndef f(p):\n    return torch.jit.load(p)\n",
        "torch.jit.load",
    ),
    "h5py_file": (
        "def f(p):\n    import h5py\n    return h5py.File(p, 'r')\n",
        "h5py.File",
    ),
    "h5py_from": ("from h5py import File\ndef f(p):\n    File(p)\n", "h5py.File"),
    "numpy_load": (
        "import numpy as np\ndef f(p):\n    return np.load(p)\n",
        "numpy.load",
    ),
    "numpy_save": (
        "import numpy\ndef f(p, a):\n    numpy.save(p, a)\n",
        "numpy.save",
    ),
    "subprocess": (
        "import subprocess\ndef f():\n    subprocess.run(['ls'])\n",
        "subprocess.run",
    ),
    "signal": (
        "import signal\ndef f(h):\n    signal.signal(15, h)\n",
        "signal.signal",
    ),
    "socket": (
        "import socket\ndef f():\n    return socket.socket()\n",
        "socket.socket",
    ),
    "import_module": (
        "import importlib\ndef f():\n    return importlib.import_module('os')\n",
        "importlib.import_module",
    ),
    "dunder_import": ("def f():\n    return __import__('os')\n", "builtins.__import__"),
    "builtins_module": (
        "import builtins\ndef f(p):\n    return builtins.open(p)\n",
        "builtins.open",
    ),
    "io_open_alias": ("from io import open as o\ndef f(p):\n    o(p)\n", "io.open"),
    "torch_alias": (
        "import torch as T\ndef f(p):\n    return T.load(p)\n",
        "torch.load",
    ),
    "deepmd_kit": (
        "def f(p):\n    from deepmd.common import j_loader\n    return j_loader(p)\n",
        "deepmd.common.j_loader",
    ),
}

#: Look-alikes the checker must leave alone.
HARMLESS = (
    "import os\nimport dataclasses\nfrom pathlib import Path\n"
    "def f(p, storage, store, s, x):\n"
    "    os.path.join(p, 'a')\n    os.fspath(p)\n    os.path.abspath(p)\n"
    "    s.replace('a', 'b')\n    dataclasses.replace(x, a=1)\n"
    "    storage.rename(p, p)\n    storage.entry(p)\n    store.open()\n"
    "    store.resolve('latest')\n    Path(p).name\n    p.with_suffix('.x')\n"
    "    open = 3\n"
)


def plant(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A package ``planted`` under ``tmp_path`` holding ``modules``."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in modules.items():
        (package / f"{name}.py").write_text(textwrap.dedent(text))
    return package


def test_every_kind_of_escape_is_caught(tmp_path):
    package = plant(tmp_path, {n: text for n, (text, _) in ESCAPES.items()})
    for name, (_, touch) in ESCAPES.items():
        found = escapes(package / f"{name}.py", {}, package)
        assert [f.split(" ", 1)[1] for f in found] == [touch], name
        # and its entry in a table lets it pass, as the real table does
        assert (
            escapes(package / f"{name}.py", {f"{name}.py": {touch: "?"}}, package) == []
        )


def test_look_alikes_are_left_alone(tmp_path):
    package = plant(tmp_path, {"harmless": HARMLESS})
    assert touches(package / "harmless.py", package) == {}


def test_the_real_table_refuses_what_it_does_not_name(tmp_path):
    """An escape planted in a host or command module of a copy is caught by the table."""
    package = plant(tmp_path, {})
    for folder, text, touch in (
        ("deepmd", "import os\ndef f(d):\n    os.rmdir(d)\n", "os.rmdir"),
        ("deepmd", "import torch\ndef f(p):\n    torch.load(p)\n", "torch.load"),
        ("commands", "def f(p):\n    return open(p).read()\n", "builtins.open"),
    ):
        (package / folder).mkdir(exist_ok=True)
        module = package / folder / "prepare.py"
        module.write_text(text)
        assert [e.split(" ", 1)[1] for e in escapes(module, ALLOWED, package)] == [
            touch
        ]


def test_a_folder_entry_covers_its_modules(tmp_path):
    package = plant(tmp_path, {})
    (package / "storage").mkdir()
    (package / "storage" / "disk.py").write_text("import os\nos.unlink('x')\n")
    table = {"storage/": {"*": "the storage layer"}}
    assert escapes(package / "storage" / "disk.py", table, package) == []
    assert escapes(package / "storage" / "disk.py", {}, package) != []


# -- the direction of imports ------------------------------------------------------


def imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[str, bool]]:
    """Return ``(absolute module, at module level)`` for every import in a file."""
    name = module_name(path, root)
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


# -- the hook facade ----------------------------------------------------------------

#: The only module that may call a hook (``pm.hook.<name>``).
FACADE = "dp_ckpt_plugin.plugin.hooks"


def hook_calls(path: Path) -> list[str]:
    """Every use of ``<manager>.hook`` (or pluggy's hook machinery) in ``path``."""
    tree = ast.parse(path.read_text("utf-8"))
    return [
        f"{module_name(path, path.parent)}:{node.lineno} {_dotted(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in {"hook", "subset_hook_caller", "get_hookimpls"}
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_hooks_are_called_only_through_the_facade(path):
    if module_name(path) == FACADE:
        return
    assert hook_calls(path) == []


def test_the_hook_checker_sees_a_raw_hook_call(tmp_path):
    package = plant(tmp_path, {"raw": "def f(pm):\n    pm.hook.on_commit()\n"})
    assert len(hook_calls(package / "raw.py")) == 1


def test_the_store_reads_in_one_sitting():
    """The store stays small (about 300 lines of code besides its docstrings):
    writing, publishing, pruning, resuming and describing live in their own
    modules. (Its resolve takes a host's context and keeps the verified bytes
    for its load: the one restart path.)"""
    source = (PACKAGE / "store" / "core.py").read_text("utf-8")
    tree = ast.parse(source)
    documented = [
        node.body[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and ast.get_docstring(node)
    ]
    docs = sum(d.end_lineno - d.lineno + 1 for d in documented)
    code = source.count("\n") - docs
    assert code <= 320, f"store.py has {code} lines besides its docstrings"


# -- the layers -----------------------------------------------------------------

#: The package's folders and top-level modules, from the ground up: a module
#: imports only from its own folder and the layers below it (type-checking
#: imports included). Two folders on one layer do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("text",),
    ("errors",),
    ("markers",),
    ("blocklist",),
    ("ranks",),
    ("storage",),
    ("retention",),
    ("checkpoint",),
    ("formats",),
    ("resolution", "background"),
    ("hookspecs",),
    ("plugin",),
    ("objectstore",),
    ("store",),
    ("remote",),
    ("manager", "commands", "deepmd"),
    ("__main__",),
]


def room_of(module: str) -> str | None:
    """The folder or top-level module of a dotted name inside the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def against_the_layers(paths, root: Path, layers) -> list[str]:
    """Every import of ``paths`` that runs to a higher layer or across one."""
    level = {room: i for i, rooms in enumerate(layers) for room in rooms}
    wrong = []
    for path in paths:
        source = room_of(module_name(path, root))
        for target, _ in imports_of(path, root):
            if not target.startswith(root.name + "."):
                continue
            to = room_of(target)
            if to == source or source is None:
                continue
            if not ((root / to).is_dir() or (root / f"{to}.py").is_file()):
                continue  # a name of the package itself (``__version__``)
            if to not in level or source not in level:
                wrong.append(f"{module_name(path, root)}: {to} has no layer")
            elif level[to] >= level[source]:
                wrong.append(f"{module_name(path, root)} imports from {to}")
    return sorted(set(wrong))


def test_every_import_runs_down_the_layers():
    assert against_the_layers(MODULES, PACKAGE, LAYERS) == []


def test_the_layers_name_every_folder_and_module():
    rooms = {room_of(module_name(p)) for p in MODULES} - {None}
    named = {room for rooms in LAYERS for room in rooms}
    assert rooms == named


@pytest.mark.parametrize(
    "module, source",
    [
        ("low/a.py", "from ..high import b\n"),
        (
            "low/a.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high.b import X\n",
        ),
        ("left/a.py", "import pkg.right.b\n"),
        ("stray/a.py", "from ..low import a\n"),
    ],
    ids=["upward", "upward-type-checking", "across-one-layer", "no-layer"],
)
def test_an_import_against_the_layers_is_caught(tmp_path, module, source):
    package = tmp_path / "pkg"
    modules = {
        "__init__.py": "",
        "low/__init__.py": "",
        "left/__init__.py": "",
        "right/__init__.py": "",
        "right/b.py": "",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\n",
        module: source,
    }
    for name, text in modules.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    layers = [("low",), ("left", "right"), ("high",)]
    paths = sorted(package.rglob("*.py"))
    wrong = against_the_layers(paths, package, layers)
    assert len(wrong) == 1, wrong
    clean = [p for p in paths if p != package / module]
    assert against_the_layers(clean, package, layers) == []


def _is_store_remote(node: ast.AST) -> bool:
    """``store.remote`` or ``<x>.store.remote``: a store's remote side."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "remote"
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "store")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "store")
        )
    )


def _remote_members_used() -> dict[str, set[str]]:
    """Attributes read on a store's remote side, by module (not ``remote/``).

    ``store.remote.X``, ``self.store.remote.X``, and ``remote.X`` in a
    function that named ``remote = store.remote``; a store's own
    ``self.remote.X`` in ``store/``.
    """
    used: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("remote/") or rel == "commands/sync.py":
            continue  # the adapter itself, and the command that builds one
        tree = ast.parse(path.read_text("utf-8"))
        for scope in ast.walk(tree):
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            named = any(
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "remote" for t in n.targets)
                and _is_store_remote(n.value)
                for n in ast.walk(scope)
            )
            for node in ast.walk(scope):
                if not isinstance(node, ast.Attribute):
                    continue
                value = node.value
                own = (
                    rel.startswith("store/")
                    and isinstance(value, ast.Attribute)
                    and value.attr == "remote"
                    and isinstance(value.value, ast.Name)
                    and value.value.id == "self"
                )
                local = named and isinstance(value, ast.Name) and value.id == "remote"
                if own or local or _is_store_remote(value):
                    used.setdefault(rel, set()).add(node.attr)
    return used


def test_the_store_and_the_hosts_reach_object_storage_only_through_the_replica_seam():
    from dp_ckpt_plugin.store.replica import Replica

    members = {n for n in dir(Replica) if not n.startswith("_")}
    used = _remote_members_used()
    assert used, "no use of a remote store was found: the check reads nothing"
    outside = {rel: names - members for rel, names in used.items() if names - members}
    assert outside == {}, outside
