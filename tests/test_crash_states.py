"""Every state a power loss can leave during a save, reopened (ALICE, OSDI'14).

A save is run for real in a temporary directory while the file operations of
the store are recorded, in order: the creation of a file and its content,
``fsync`` of a file or of a directory, ``rename``, ``unlink``, ``mkdir``,
``symlink`` and ``link``. Operations are recorded whatever thread issues them
(a background save runs on the store's worker thread), each logged together
with the real call under one lock, so the log holds them in the order they
happened. From the directory as it was before the save (the
*initial state*) and this log, every state a file system may leave after a
crash at every point of the log is generated under two models, materialized
in a fresh directory and reopened by a new store.

Models of what survives a crash once operations ``0..k`` were issued
--------------------------------------------------------------------
``posix`` (the weakest POSIX guarantees)
    A file's data is durable only after an ``fsync`` of that file; before,
    the file may be empty or hold its full content. A directory operation
    (create, rename, unlink, mkdir, symlink, link) is durable only after a
    later ``fsync`` of its directory (of both, for a rename between two
    directories); an ``fsync`` of a file does not persist its name. Until
    then any subset of the pending directory operations may have reached the
    disk; a subset is applied in issue order. A rename itself is atomic: the
    target names the old file or the new one, never a mix. Entries whose
    parent directory did not persist are gone. With more than ten pending
    items (operations and unsynced files), a few hundred subsets are sampled
    with a fixed seed, besides all, none, and each item dropped alone.
``ordered`` (like ext4 ``data=ordered``)
    Operations persist in issue order: the states are the prefixes of the
    log. Data written to a file before an operation that exposes it persists
    with it.

States are deduplicated by the content of their whole tree before checking;
a tree that also arises once the save returned must pass the stricter check.

Invariants, checked by new managers (``verify="digest"``) in every state
------------------------------------------------------------------------
- When the save had returned (the crash follows its last operation; for a
  background save, once ``wait()`` returned), ``restore("latest")`` gives
  exactly its payload.
- What ``restore("latest")`` and the restore of each committed numbered file
  give is, value for value, a payload saved for that step before or during
  the scenario: wrong content is never accepted.
- ``latest`` never falls below the step that was latest before the save. An
  earlier run that the save archives is never lost: each of its checkpoints
  is either still in the store directory or, whole and with its record, in
  an archive folder.
- The next run (restore ``latest``, save step 99) succeeds, and step 99
  restores.
- After that open and save, the store directory holds no temporary file, no
  commit record whose payload is missing, and no numbered checkpoint without
  a valid record.

The test fails listing every violation (scenario, model, crash point, what
was lost, what is wrong) and prints how many distinct states each model gave.

The explorer's own tests take out, one at a time, each ordering the store
relies on (directory fsyncs; the record before the payload's name; a new
directory made durable in its parent; a payload's unlink made durable before
its record's; the double record of a re-save; archived payloads made durable
before their records), patching a broken copy of the real function in for one
recorded save, and require the models that should catch it to report it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
import posixpath
import random
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import (
    assert_same,
    family,
    is_temp,
    make_payload,
    open_manager,
    plugin_manager,
)

from dp_ckpt_plugin.checkpoint.catalogue import (
    committed,
    read_record_or_none,
    uncommitted,
)
from dp_ckpt_plugin.checkpoint.layout import record_target
from dp_ckpt_plugin.checkpoint.records import (
    make_record,
    record_path,
    verify,
    write_record,
)
from dp_ckpt_plugin.errors import RestartNotFoundError
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.store import archive as archiving
from dp_ckpt_plugin.store import commit, pruning
from dp_ckpt_plugin.store import publish as publishing
from dp_ckpt_plugin.store.publish import Mirror

#: Where the store directory lies under a scenario's root (created by the save).
STORE = "run/models"
#: A directory tree: relative path -> (kind, content). Kinds are ``dir``
#: (content None), ``file`` (bytes) and ``link`` (the symlink's target).
Tree = dict[str, tuple[str, object]]

# -- the log ------------------------------------------------------------------

#: Operations that change a directory, and so are durable only after its fsync.
NAMESPACE_OPS = ("create", "mkdir", "symlink", "link", "rename", "unlink")


@dataclass(frozen=True)
class Op:
    """One recorded file operation.

    Attributes
    ----------
    kind : str
        ``create``, ``write``, ``fsync`` (of a file), ``fsync_dir``,
        ``rename``, ``unlink``, ``mkdir``, ``symlink`` or ``link``.
    path : str
        The path it acts on, relative to the root (the source of a rename or
        link).
    inode : int or None
        The file it acts on (``None`` for ``fsync_dir``).
    dst : str or None
        The new name of a rename or link.
    data : bytes or None
        The whole content of the file after a ``write``.
    """

    kind: str
    path: str
    inode: int | None = None
    dst: str | None = None
    data: bytes | None = None

    def directories(self) -> tuple[str, ...]:
        """The directories whose entries this operation changes."""
        if self.kind not in NAMESPACE_OPS:
            return ()
        names = {"rename": (self.path, self.dst), "link": (self.dst,)}
        changed = names.get(self.kind, (self.path,))
        return tuple(sorted({posixpath.dirname(n) or "." for n in changed}))

    def __str__(self) -> str:
        if self.dst is not None:
            return f"{self.kind} {self.path} -> {self.dst}"
        if self.data is not None:
            return f"write {self.path} ({len(self.data)} bytes)"
        return f"{self.kind} {self.path}"


@dataclass
class Log:
    """The initial state of a root and the operations recorded after it.

    Attributes
    ----------
    names : dict
        The initial namespace: relative path -> inode.
    kinds : dict
        Inode -> ``file``, ``dir`` or ``link``, for every inode ever seen.
    targets : dict
        Inode of a symlink -> its target.
    initial : dict
        Inode -> its content in the initial state (durable).
    ops : list of Op
        The recorded operations, in issue order.
    threads : list of str
        The name of the thread that issued each recorded operation.
    """

    names: dict[str, int] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    targets: dict[int, str] = field(default_factory=dict)
    initial: dict[int, bytes] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)

    def add(self, kind: str, content: object = None) -> int:
        """Register a new inode; return its number."""
        inode = len(self.kinds)
        self.kinds[inode] = kind
        if kind == "link":
            self.targets[inode] = content
        return inode

    @classmethod
    def of_tree(cls, tree: Tree) -> Log:
        """Return a log whose initial state is ``tree`` and with no operation."""
        log = cls()
        for path, (kind, content) in sorted(tree.items()):
            if path == ".":
                continue
            inode = log.add(kind, content)
            log.names[path] = inode
            if kind == "file":
                log.initial[inode] = content
        return log


def scan(root: Path) -> Tree:
    """Return the tree under ``root``, symlinks not followed."""
    tree: Tree = {".": ("dir", None)}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                tree[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                tree[rel] = ("dir", None)
            else:
                tree[rel] = ("file", Path(full).read_bytes())
    return tree


# -- recording ----------------------------------------------------------------


def _serialized(wrapper: Callable) -> Callable:
    """Run a wrapper holding the recorder's lock.

    The real call and its log entry are then one step: when several threads
    (the caller and a background writer) touch files, the log holds their
    operations in the order the calls happened.
    """

    @functools.wraps(wrapper)
    def run(self, *args, **kwargs):
        with self.lock:
            return wrapper(self, *args, **kwargs)

    return run


class Recorder(LocalStorage):
    """A storage that logs the file operations under ``root`` once started.

    The store's own storage: every system call the store makes goes through
    the ``_sys_*`` methods of :class:`~dp_ckpt_plugin.storage.local.LocalStorage`,
    which this class overrides (nothing of ``os`` is patched). Calls of every
    thread are logged, each with the name of its thread; a lock makes each
    call and its log entry one step (see :func:`_serialized`). A file's
    content is captured whenever an operation observes the file (its fsync,
    its rename, link or unlink) and at the end, as a ``write`` logged just
    before that operation.

    Parameters
    ----------
    directory : Path
        The store directory (the storage is confined to it).
    """

    def __init__(self, directory: Path, *, mirrors: Iterable[Path] = ()) -> None:
        super().__init__(directory, mirrors=mirrors)
        self.lock = threading.RLock()
        self.recording = False

    def start(self, root: Path) -> None:
        """Log from now on the operations under ``root`` (its tree is the initial state)."""
        with self.lock:
            self.record_root = os.path.realpath(root)
            self.log = Log.of_tree(scan(root))
            self.live = dict(self.log.names)
            self.known = dict(self.log.initial)
            self.recording = True

    @_serialized
    def finish(self) -> Log:
        """Stop; capture the last content of every file; check nothing was missed."""
        for rel in list(self.live):
            self._observe(rel)
        self.recording = False
        replayed = tree_of(
            self.log, replay(self.log.ops, self.log.names), latest_data(self.log)
        )
        actual = scan(Path(self.record_root))
        missed = sorted(set(replayed.items()) ^ set(actual.items()))
        assert not missed, f"the recorder missed operations on {missed[:3]}"
        return self.log

    # -- helpers -------------------------------------------------------------
    def _rel(self, path) -> str | None:
        """``path`` relative to the root, or ``None`` if outside it (or not recording)."""
        if not self.recording:
            return None
        full = os.path.abspath(os.fsdecode(os.fspath(path)))
        if full == self.record_root:
            return "."
        if full.startswith(self.record_root + os.sep):
            return os.path.relpath(full, self.record_root)
        return None

    def _emit(self, kind: str, path: str, inode=None, **extra) -> None:
        self.log.ops.append(Op(kind, path, inode, **extra))
        self.log.threads.append(threading.current_thread().name)

    def _new(self, rel: str, kind: str, content: object = None) -> int:
        inode = self.log.add(kind, content)
        self.live[rel] = inode
        if kind == "file":
            self.known[inode] = b""
        self._emit(
            {"file": "create", "dir": "mkdir", "link": "symlink"}[kind], rel, inode
        )
        return inode

    def _observe(self, rel: str) -> int:
        """Log a ``write`` if the file at ``rel`` changed; return its inode."""
        inode = self.live.get(rel)
        assert inode is not None, f"the recorder missed the creation of {rel}"
        if self.log.kinds[inode] == "file":
            with open(os.path.join(self.record_root, rel), "rb") as f:
                data = f.read()
            if data != self.known[inode]:
                self.known[inode] = data
                self._emit("write", rel, inode, data=data)
        return inode

    # -- the system calls ------------------------------------------------------
    @_serialized
    def _sys_open(self, path, flags, mode=0o644):
        rel = self._rel(path)
        existed = rel is not None and os.path.lexists(path)
        fd = super()._sys_open(path, flags, mode)
        if rel is not None and flags & os.O_CREAT and not existed:
            self._new(rel, "file")
        elif rel is not None and flags & os.O_TRUNC:
            self._observe(rel)
        return fd

    @_serialized
    def _sys_fsync(self, fd, path):
        rel = self._rel(path)
        if rel is not None:
            self._emit("fsync", rel, self._observe(rel))
        return super()._sys_fsync(fd, path)

    @_serialized
    def _sys_fsync_dir(self, directory):
        rel = self._rel(directory)
        if rel is not None:
            self._emit("fsync_dir", rel)
        return super()._sys_fsync_dir(directory)

    @_serialized
    def _sys_rename(self, src, dst):
        old, new = self._rel(src), self._rel(dst)
        if (old is None and new is None) or not os.path.lexists(src):
            return super()._sys_rename(src, dst)
        assert old is not None and new is not None, f"a move across {self.record_root}"
        inode = self._observe(old)
        assert self.log.kinds[inode] != "dir", "directory renames are not modelled"
        super()._sys_rename(src, dst)
        self.live[new] = self.live.pop(old)
        self._emit("rename", old, inode, dst=new)
        return None

    @_serialized
    def _sys_unlink(self, path):
        rel = self._rel(path)
        if rel is None or not os.path.lexists(path):
            return super()._sys_unlink(path)
        inode = self._observe(rel)
        super()._sys_unlink(path)
        del self.live[rel]
        self._emit("unlink", rel, inode)
        return None

    @_serialized
    def _sys_mkdir(self, path):
        super()._sys_mkdir(path)
        rel = self._rel(path)
        if rel is not None:
            self._new(rel, "dir")

    @_serialized
    def _sys_rmdir(self, path):
        assert self._rel(path) is None, "directory removals are not modelled"
        return super()._sys_rmdir(path)

    @_serialized
    def _sys_symlink(self, target, path):
        super()._sys_symlink(target, path)
        rel = self._rel(path)
        if rel is not None:
            self._new(rel, "link", os.fsdecode(target))

    @_serialized
    def _sys_link(self, src, dst):
        super()._sys_link(src, dst)
        old, new = self._rel(src), self._rel(dst)
        if new is not None:
            assert old is not None, f"a link into {self.record_root} from outside"
            inode = self._observe(old)
            self.live[new] = inode
            self._emit("link", old, inode, dst=new)


# -- crash states -------------------------------------------------------------


@dataclass
class CrashState:
    """One state a crash may leave.

    Attributes
    ----------
    tree : Tree
        The files, links and directories.
    point : int
        The last operation issued before the crash (-1: none).
    lost : tuple of str
        The issued operations and file contents that did not persist.
    returned : bool
        Whether the save had returned (the crash follows its last operation).
    """

    tree: Tree
    point: int
    lost: tuple[str, ...] = ()
    returned: bool = False


def replay(ops: Iterable[Op], names: dict[str, int] | None = None) -> dict[str, int]:
    """Apply the namespace operations of ``ops`` to ``names``; return the result.

    A rename or unlink acts on its file: when an earlier operation that made
    it reachable under the old name did not persist, the rename still gives
    it the new name and the unlink does nothing.
    """
    names = dict(names or {})
    for op in ops:
        if op.kind in ("create", "mkdir", "symlink"):
            names[op.path] = op.inode
        elif op.kind == "link":
            names[op.dst] = op.inode
        elif op.kind in ("rename", "unlink"):
            if names.get(op.path) == op.inode:
                del names[op.path]
            if op.kind == "rename":
                names[op.dst] = op.inode
    return names


def tree_of(log: Log, names: dict[str, int], data: Callable[[int], bytes]) -> Tree:
    """The tree ``names`` give, with file content by ``data``.

    Entries whose parent directory is missing are dropped (with their own).
    """
    tree: Tree = {".": ("dir", None)}
    for path in sorted(names, key=lambda p: p.count("/")):
        parent = posixpath.dirname(path) or "."
        if tree.get(parent, ("",))[0] != "dir":
            continue
        inode = names[path]
        kind = log.kinds[inode]
        if kind == "file":
            tree[path] = (kind, data(inode))
        else:
            tree[path] = (kind, log.targets.get(inode))
    return tree


def file_data(log: Log, point: int, *, synced: bool) -> dict[int, bytes]:
    """The content of every file after operation ``point``.

    With ``synced``, only what an fsync of the file made durable: the last
    write before its last fsync (a new file that was never fsynced is empty).
    """
    files = [inode for inode, kind in log.kinds.items() if kind == "file"]
    data = {inode: log.initial.get(inode, b"") for inode in files}
    issued = log.ops[: point + 1]
    last_sync = {op.inode: i for i, op in enumerate(issued) if op.kind == "fsync"}
    for i, op in enumerate(issued):
        if op.kind == "write" and (not synced or i < last_sync.get(op.inode, -1)):
            data[op.inode] = op.data
    return data


def latest_data(log: Log) -> Callable[[int], bytes]:
    """The last content each file was given in the whole log."""
    return file_data(log, len(log.ops) - 1, synced=False).__getitem__


def pending_ops(ops: list[Op], point: int) -> tuple[list[int], list[int]]:
    """Split the namespace operations up to ``point`` into durable and pending.

    An operation is durable once each directory it changes was fsynced after
    it (and no later than ``point``).
    """
    durable, pending = [], []
    for i, op in enumerate(ops[: point + 1]):
        dirs = op.directories()
        if not dirs:
            continue
        later = ops[i + 1 : point + 1]
        synced = all(
            any(o.kind == "fsync_dir" and o.path == d for o in later) for d in dirs
        )
        (durable if synced else pending).append(i)
    return durable, pending


def choices(count: int, rng: random.Random, exhaustive: int = 10, samples: int = 300):
    """Which of ``count`` pending items persist: every subset, or a sample.

    Yields tuples of booleans (True: persisted). Above ``exhaustive`` items:
    all, none, each one dropped alone, then ``samples`` random subsets.
    """
    if count <= exhaustive:
        yield from itertools.product((True, False), repeat=count)
        return
    yield (True,) * count
    yield (False,) * count
    for dropped in range(count):
        yield tuple(i != dropped for i in range(count))
    for _ in range(samples):
        yield tuple(rng.random() < 0.5 for _ in range(count))


def posix_states(log: Log, seed: str) -> Iterator[CrashState]:
    """The states of the POSIX weakest model after each operation (see above)."""
    last = len(log.ops) - 1
    for point in range(-1, last + 1):
        durable, pending = pending_ops(log.ops, point)
        full = file_data(log, point, synced=False)
        synced = file_data(log, point, synced=True)
        unsynced = [inode for inode in full if full[inode] != synced[inode]]
        items = [str(log.ops[i]) for i in pending]
        items += [f"data of {_name_of(log, inode)}" for inode in unsynced]
        rng = random.Random(f"{seed}:{point}")
        for kept in choices(len(items), rng):
            ops_kept, data_kept = kept[: len(pending)], kept[len(pending) :]
            ops = [i for i, k in zip(pending, ops_kept, strict=True) if k]
            names = replay((log.ops[i] for i in sorted(durable + ops)), log.names)
            data = dict(synced)
            data.update(
                (i, full[i]) for i, k in zip(unsynced, data_kept, strict=True) if k
            )
            lost = tuple(item for item, k in zip(items, kept, strict=True) if not k)
            tree = tree_of(log, names, data.__getitem__)
            yield CrashState(tree, point, lost, point == last)


def ordered_states(log: Log) -> Iterator[CrashState]:
    """The states of the ordered-metadata model: every prefix of the log."""
    last = len(log.ops) - 1
    for point in range(-1, last + 1):
        names = replay(log.ops[: point + 1], log.names)
        data = file_data(log, point, synced=False)
        yield CrashState(
            tree_of(log, names, data.__getitem__), point, (), point == last
        )


def _name_of(log: Log, inode: int) -> str:
    """The first path the log gives ``inode``, for messages."""
    for op in log.ops:
        if op.inode == inode:
            return op.path
    return f"inode {inode}"


def tree_key(tree: Tree) -> str:
    """A digest of a whole tree: paths, kinds and content."""
    digest = hashlib.sha256()
    for path, (kind, content) in sorted(tree.items()):
        value = content if isinstance(content, bytes) else str(content).encode()
        digest.update(f"{path}\0{kind}\0{len(value)}\0".encode() + value)
    return digest.hexdigest()


def distinct(states: Iterable[CrashState]) -> list[CrashState]:
    """The states with distinct trees; one seen after the save returned wins."""
    found: dict[str, CrashState] = {}
    for state in states:
        key = tree_key(state.tree)
        if key not in found or (state.returned and not found[key].returned):
            found[key] = state
    return list(found.values())


def materialize(tree: Tree, dest: Path) -> None:
    """Create ``tree`` under ``dest`` (which must not exist)."""
    dest.mkdir(parents=True)
    for path in sorted(tree, key=lambda p: p.count("/")):
        kind, content = tree[path]
        target = dest / path
        if path == ".":
            continue
        if kind == "dir":
            target.mkdir()
        elif kind == "file":
            target.write_bytes(content)
        else:
            os.symlink(content, target)


# -- scenarios ----------------------------------------------------------------


def payload(step: int, version: int = 0) -> dict:
    """The payload of ``step``; another ``version`` has other arrays."""
    if version == 0:
        return make_payload(step)
    other = make_payload(step + 1000 * version)
    return {**other, "step": step, "tag": f"step-{step}-v{version}"}


def same(a, b) -> bool:
    """Whether two payloads are equal, value for value (keys, dtypes, types)."""
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


@dataclass(frozen=True)
class Scenario:
    """A save to record, and what was saved before it.

    Attributes
    ----------
    name : str
        For messages.
    save : (int, int)
        Step and payload version of the recorded save.
    before : tuple of (int, int)
        Saved (step, version) by the same manager before the recording.
    earlier_run : tuple of int
        Steps committed by an earlier, closed run before the manager opens.
    max_keep : int
        Retention window of the saving manager.
    async_save : bool
        Whether the saving manager writes in the background
        (``CheckpointManager(async_save=True)``): each save is waited for,
        and the recorded one is ``save`` followed by ``wait``, whose file
        operations all run on the store's worker thread.
    mirror : bool
        Whether the family has the mirrors the ``dp`` host gives it, outside
        the store directory: a pointer (:data:`MIRROR`, fsynced) and an alias
        beside it.
    """

    name: str
    save: tuple[int, int]
    before: tuple[tuple[int, int], ...] = ()
    earlier_run: tuple[int, ...] = ()
    max_keep: int = 2
    async_save: bool = False
    mirror: bool = False

    def saved(self, step: int) -> list[dict]:
        """Every payload saved for ``step`` before or during the scenario."""
        versions = {v for s, v in self.before if s == step}
        versions |= {0} if step in self.earlier_run else set()
        versions |= {self.save[1]} if self.save[0] == step else set()
        return [payload(step, v) for v in sorted(versions)]

    @property
    def floor(self) -> int | None:
        """The step that was latest when the recorded save started."""
        return self.before[-1][0] if self.before else None


SCENARIOS = [
    Scenario("first-save", save=(1, 0)),
    Scenario("prune", save=(3, 0), before=((1, 0), (2, 0))),
    # the records of the previous prune (step 1's) go in this save, once the
    # removal of their payloads is durable
    Scenario("prune-again", save=(4, 0), before=((1, 0), (2, 0), (3, 0))),
    Scenario("resave", save=(2, 1), before=((1, 0), (2, 0)), max_keep=5),
    Scenario("archive", save=(1, 1), earlier_run=(1, 2, 3)),
    # the background writer: steps 1 and 2 saved and waited for, then
    # ``save(3)`` (a snapshot) and ``wait()``, the worker thread writing,
    # committing, publishing and pruning step 1
    Scenario("background", save=(3, 0), before=((1, 0), (2, 0)), async_save=True),
    # as ``prune``, with a pointer and an alias mirrored in the store's parent
    # (deepmd-kit's working directory): the pointer's bytes are written and
    # fsynced beside the fsync of ``D``, its move waits for that fsync
    Scenario("mirrors", save=(3, 0), before=((1, 0), (2, 0)), mirror=True),
]

#: The mirrored pointer of the ``mirrors`` scenario, relative to the root.
MIRROR = "run/checkpoint"


def record(scenario: Scenario, root: Path, pm, *, alter=None) -> Log:
    """Prepare the scenario under ``root``, then record its save.

    Parameters
    ----------
    scenario : Scenario
        What to save.
    root : Path
        A directory to create; the store directory is ``root/run/models``.
    pm : pluggy.PluginManager
        The plugin manager of the managers.
    alter : callable, optional
        Called with the monkeypatch of the recording and the recorder, to
        break the store on purpose (the explorer's own tests).

    Returns
    -------
    Log
        The tree before the save and the operations of the save.
    """
    root.mkdir()
    directory = Path(os.path.realpath(root)) / STORE
    if scenario.earlier_run:
        with open_manager(directory, pm=pm, max_keep=0) as earlier:
            for step in scenario.earlier_run:
                earlier.save(step, payload(step))
    mirrors = ()
    if scenario.mirror:
        outside = Path(os.path.realpath(root))
        mirrors = (
            Mirror(outside / MIRROR, "pointer"),
            Mirror(outside / "run" / family().alias, "alias"),
        )
    recorder = Recorder(directory, mirrors=[m.path for m in mirrors])
    manager = open_manager(
        directory,
        pm=pm,
        max_keep=scenario.max_keep,
        async_save=scenario.async_save,
        storage=recorder,
    )
    if mirrors:
        config = manager.store.families[family().prefix]
        manager.store.add_family(dataclasses.replace(config, mirrors=mirrors))
    try:
        for step, version in scenario.before:
            manager.save(step, payload(step, version))
        manager.wait()
        recorder.start(root)
        with pytest.MonkeyPatch.context() as mp:
            if alter is not None:
                alter(mp, recorder)
            manager.save(scenario.save[0], payload(*scenario.save))
            manager.wait()  # the background save, if any, is done
        return recorder.finish()
    finally:
        manager.close()


# -- checks -------------------------------------------------------------------


def check_state(scenario: Scenario, root: Path, returned: bool, pm) -> list[str]:
    """Reopen the store of a materialized state; say what is wrong with it."""
    directory = root / STORE
    problems = check_committed(scenario, directory, pm)
    problems += check_next_run(scenario, directory, returned, pm)
    problems += check_leftovers(directory)
    problems += check_earlier_run(scenario, directory, pm)
    if scenario.mirror:
        problems += check_mirror(scenario, root, returned)
    return problems


def check_mirror(scenario: Scenario, root: Path, returned: bool) -> list[str]:
    """The mirrored pointer names a payload that is there, the saved one once returned.

    Plain deepmd-kit reads it: it is never empty, and never names a file
    whose name a crash took (the payload's name is durable before it moves).
    """
    pointer = root / MIRROR
    if not pointer.exists():
        return ["the mirrored pointer is gone"]
    text = pointer.read_text()
    if not text:
        return ["the mirrored pointer is empty"]
    named = pointer.parent / text
    problems = []
    if not named.is_file():
        problems.append(f"the mirrored pointer names {text}, which is not there")
    step = family().step_of(named.name)
    if returned and step != scenario.save[0]:
        problems.append(
            f"the mirrored pointer names step {step} once the save returned"
        )
    floor = scenario.floor
    if floor is not None and step is not None and step < floor:
        problems.append(f"the mirrored pointer went back to step {step} from {floor}")
    return problems


def check_committed(scenario: Scenario, directory: Path, pm) -> list[str]:
    """Each committed numbered file restores a payload saved for its step."""
    problems = []
    with open_manager(directory, pm=pm, verify="digest", lock=False) as reader:
        for checkpoint in committed(directory, family()):
            name = checkpoint.path.name
            try:
                restored = reader.restore(str(checkpoint.path))
            except Exception as exc:
                problems.append(f"committed {name} does not restore: {exc}")
                continue
            if not any(
                same(restored.state, p) for p in scenario.saved(checkpoint.step)
            ):
                problems.append(f"committed {name} restores content never saved")
    return problems


def check_next_run(
    scenario: Scenario, directory: Path, returned: bool, pm
) -> list[str]:
    """``latest`` is right, and a new run resuming from it saves step 99.

    The new run keeps every checkpoint (``max_keep=0``), so that retention
    removes nothing the later checks look for.
    """
    problems = []
    manager = open_manager(directory, pm=pm, verify="digest", max_keep=0)
    try:
        try:
            latest = manager.restore("latest")
        except RestartNotFoundError:
            latest = None
        problems += judge_latest(scenario, latest, returned)
        manager.save(99, payload(99))
        again = manager.restore("latest")
        if again.step != 99 or not same(again.state, payload(99)):
            problems.append(f"after saving step 99, latest restores step {again.step}")
    except Exception as exc:
        problems.append(f"the next run failed: {type(exc).__name__}: {exc}")
    finally:
        manager.close()
    return problems


def judge_latest(scenario: Scenario, latest, returned: bool) -> list[str]:
    """What is wrong with what ``restore("latest")`` gave (``None``: nothing)."""
    step, version = scenario.save
    floor = scenario.floor
    if latest is None:
        if returned:
            return ["latest finds nothing although the save returned"]
        if floor is not None:
            return [f"latest finds nothing; it was step {floor} before the save"]
        return []
    problems = []
    if not any(same(latest.state, p) for p in scenario.saved(latest.step)):
        problems.append(f"latest restores content never saved for step {latest.step}")
    if returned and (
        latest.step != step or not same(latest.state, payload(step, version))
    ):
        problems.append(f"latest is step {latest.step}, not the save that returned")
    if floor is not None and latest.step < floor:
        problems.append(f"latest went back to step {latest.step} from {floor}")
    return problems


def check_leftovers(directory: Path) -> list[str]:
    """Nothing the open should have swept is left in the store directory."""
    problems = []
    for name in sorted(os.listdir(directory)):
        if is_temp(name):
            problems.append(f"temporary file {name} left")
        target = record_target(name)
        if target is not None and not os.path.lexists(directory / target):
            problems.append(f"orphan record {name} left")
    for path in uncommitted(directory, family()):
        problems.append(f"numbered file {path.name} left without a valid record")
    return problems


def check_earlier_run(scenario: Scenario, directory: Path, pm) -> list[str]:
    """Each checkpoint of the earlier run is whole in the store or an archive."""
    problems = []
    for step in scenario.earlier_run:
        name = family().numbered(step)
        places = [directory / name, *sorted(directory.glob(f"archive/*/{name}"))]
        if not any(holds(path, payload(step), pm) for path in places):
            problems.append(f"the earlier run's step {step} is lost")
    return problems


def holds(path: Path, want: dict, pm) -> bool:
    """Whether ``path`` is committed (its record verifies) and holds ``want``."""
    record = read_record_or_none(path)
    if record is None:
        return False
    try:
        verify(path, record, digest=True)
        state = pm.hook.on_load_step(format="hdf5", path=path, file=None)
    except Exception:
        return False
    return same(state, want)


# -- the tests ----------------------------------------------------------------


class Explorer:
    """Check crash states of one recorded save, each distinct tree once.

    Parameters
    ----------
    scenario : Scenario
        The save recorded.
    log : Log
        Its recording.
    workdir : Path
        Where states are materialized, one at a time.
    pm : pluggy.PluginManager
        The plugin manager of the checking managers.
    """

    def __init__(self, scenario: Scenario, log: Log, workdir: Path, pm) -> None:
        self.scenario = scenario
        self.log = log
        self.workdir = workdir
        self.pm = pm
        self.verdicts: dict[tuple[str, bool], list[str]] = {}

    def check(self, state: CrashState) -> list[str]:
        """The problems of one state (found once per tree and expectation)."""
        key = (tree_key(state.tree), state.returned)
        if key not in self.verdicts:
            materialize(state.tree, self.workdir)
            try:
                self.verdicts[key] = check_state(
                    self.scenario, self.workdir, state.returned, self.pm
                )
            finally:
                shutil.rmtree(self.workdir)
        return self.verdicts[key]

    def explore(
        self, model: str, states: Iterable[CrashState]
    ) -> tuple[int, list[str]]:
        """Check the distinct ``states``; return their number and the violations."""
        unique = distinct(states)
        violations = []
        for state in unique:
            for problem in self.check(state):
                violations.append(self.describe(model, state, problem))
        return len(unique), violations

    def describe(self, model: str, state: CrashState, problem: str) -> str:
        """One line: scenario, model, crash point, what was lost, the problem."""
        after = str(self.log.ops[state.point]) if state.point >= 0 else "nothing"
        lost = f", lost: {'; '.join(state.lost)}" if state.lost else ""
        where = f"{self.scenario.name} {model} after op {state.point} ({after})"
        return f"{where}{lost}: {problem}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_crash_states(scenario, tmp_path, capsys):
    """Every crash state of the scenario's save reopens safely."""
    pm = plugin_manager()
    log = record(scenario, tmp_path / "recorded", pm)
    # the fsyncs a save runs at once are issued by threads named after the
    # thread of the save ("<name>/dp_ckpt-fsync...")
    issuers = {name.split("/dp_ckpt-fsync", 1)[0] for name in log.threads}
    if scenario.async_save:  # the worker wrote everything, the caller nothing
        assert log.ops and threading.current_thread().name not in issuers, issuers
    else:
        assert issuers <= {threading.current_thread().name}, issuers
    explorer = Explorer(scenario, log, tmp_path / "state", pm)
    counts, violations = [], []
    for model, states in (
        ("posix", posix_states(log, scenario.name)),
        ("ordered", ordered_states(log)),
    ):
        count, found = explorer.explore(model, states)
        counts.append(f"{model} {count} checked")
        violations += found
    summary = (
        f"crash states: {scenario.name} ({len(log.ops)} ops) {', '.join(counts)}, "
        f"{len(violations)} violations"
    )
    with capsys.disabled():
        print(f"\n{summary}")
    assert not violations, summary + "\n" + "\n".join(violations[:20])


def test_explorer_catches_a_save_without_directory_fsyncs(tmp_path):
    """With the storage's directory fsync a no-op, a save that returned can still vanish.

    The explorer must say so under the POSIX model (every directory
    operation of the save may be lost) and not under the ordered one.
    """
    pm = plugin_manager()
    scenario = next(s for s in SCENARIOS if s.name == "prune")

    def no_directory_fsync(mp, recorder):
        mp.setattr(recorder, "_sys_fsync_dir", lambda directory: None)

    log = record(scenario, tmp_path / "recorded", pm, alter=no_directory_fsync)
    assert not [op for op in log.ops if op.kind == "fsync_dir"]
    explorer = Explorer(scenario, log, tmp_path / "state", pm)
    returned = [s for s in posix_states(log, "broken") if s.returned]
    everything_lost = max(returned, key=lambda s: len(s.lost))
    assert "latest is step 2, not the save that returned" in explorer.check(
        everything_lost
    )
    (ordered,) = [s for s in ordered_states(log) if s.returned]
    assert explorer.check(ordered) == []


# -- the explorer catches each ordering the store relies on -------------------
#
# Each breakage below is the real function of the store minus one ordering,
# patched in for the duration of one recorded save. The unbroken functions
# give no violation (test_crash_states); each broken one must give some,
# under each model named.


def _write_new_named_first(
    path,
    serialize,
    *,
    step,
    family,
    format,
    durable,
    storage,
    metrics=None,
    sync_name=True,
    overlap=True,
    provenance=None,
    lineage=None,
):
    """:func:`commit.write_new` giving the payload its name before its record.

    Nothing is made durable between the two: a crash can keep the payload's
    name and lose the record.
    """
    tmp, digest = commit.write_hashed(path, serialize, durable=durable, storage=storage)
    record = make_record(
        tmp,
        step=step,
        family=family,
        format=format,
        name=path.name,
        digest=digest,
        metrics=metrics,
        storage=storage,
        provenance=provenance,
        lineage=lineage,
    )
    storage.move_into_place(tmp, path, durable=False)
    write_record(path, record, durable=durable, storage=storage)
    return record


def _make_dirs_without_parent_fsync(storage):
    """The storage's ``make_dirs`` not fsyncing the parent of a new directory."""

    def make_dirs(directory, *, durable=True):
        missing = []
        for candidate in (directory, *directory.parents):
            if os.path.isdir(candidate):
                break
            missing.append(candidate)
        for new in reversed(missing):
            storage._sys_mkdir(new)

    return make_dirs


def _remove_records_with_payloads(paths, *, durable, storage, left):
    """:func:`pruning.remove_payloads` unlinking each record right after its payload.

    No fsync between: a crash can keep the record's removal and lose the
    payload's.
    """
    for path in paths:
        storage.remove(path)
        storage.remove(record_path(path))


def _rewrite_record_first(
    path,
    serialize,
    *,
    old,
    step,
    family,
    format,
    durable,
    storage,
    metrics=None,
    provenance=None,
    lineage=None,
):
    """:func:`commit.rewrite` writing the final record before moving the payload.

    No record accepting both payloads: between the two, the record describes
    a payload not yet in place.
    """
    tmp, digest = commit.write_hashed(path, serialize, durable=durable, storage=storage)
    new = make_record(
        tmp,
        step=step,
        family=family,
        format=format,
        name=path.name,
        digest=digest,
        metrics=metrics,
        storage=storage,
        provenance=provenance,
        lineage=lineage,
    )
    write_record(path, new, durable=durable, storage=storage)
    storage.move_into_place(tmp, path, durable=durable)
    return new


def _archive_in_one_batch(directory, checkpoints, links=(), *, storage, durable=True):
    """:func:`archive.archive` moving payloads, records and links, then fsyncing once."""
    checkpoints = list(checkpoints)
    links = [p for p in links if os.path.lexists(p)]
    if not checkpoints:
        return None
    dest = archiving.new_archive_folder(directory, storage=storage, durable=durable)
    payloads = [c.path for c in checkpoints]
    records = [record_path(c.path) for c in checkpoints]
    for source in [*payloads, *records, *links]:
        storage.rename(source, dest / source.name)
    if durable:
        storage.sync_dir(dest)
        storage.sync_dir(directory)
    return dest


_WRITE_NEW = commit.write_new


class _Skipping:
    """A storage passing everything on to ``storage`` but ``skipped`` (a no-op)."""

    def __init__(self, storage, skipped: str) -> None:
        self._storage = storage
        self._skipped = skipped

    def __getattr__(self, name):
        if name == self._skipped:
            return lambda *args, **kwargs: None
        return getattr(self._storage, name)


def _write_new_overlapped_without(skipped: str) -> Callable:
    """:func:`commit.write_new` whose overlapped record skips ``sync_file`` or ``sync_dir``.

    ``sync_file``: the record's data is never fsynced before the payload is
    named; ``sync_dir``: the record's name is not made durable before the
    payload's move (publication's fsync of ``D`` comes after it).
    """

    def write_new(path, serialize, **kwargs):
        real = commit._record_beside

        def broken(path, storage, *args):
            return real(path, _Skipping(storage, skipped), *args)

        commit._record_beside = broken
        try:
            return _WRITE_NEW(path, serialize, **kwargs)
        finally:
            commit._record_beside = real

    return write_new


def _write_pointers_unsynced(pointers, checkpoint, storage, written):
    """:func:`publish._write_pointers` not fsyncing the mirrored pointers' bytes."""
    for target in pointers:
        data = publishing.pointer_text(checkpoint, target.path).encode("utf-8")
        written[target.path] = storage.write_temp(
            target.path, lambda handle, data=data: handle.write(data), durable=False
        )


def _publish_mirrors_with_d(checkpoint, targets, *, storage, durable=True, **_):
    """:func:`publish.publish` moving every target, then fsyncing each directory.

    The mirrors then move before the fsync of ``D`` made the payload's name
    durable: a crash can keep a mirror naming a payload whose name it lost.
    """
    directories = []
    for target in targets:
        publishing._move(target, checkpoint, storage=storage, durable=durable)
        if target.path.parent not in directories:
            directories.append(target.path.parent)
    for directory in reversed(directories):
        storage.sync_dir(directory)


@dataclass(frozen=True)
class Breakage:
    """An ordering taken out of the store, and the models that must catch it.

    Attributes
    ----------
    name : str
        For messages; also the seed of the sampling.
    scenario : str
        The name of the scenario recorded with it.
    module : module
        Where the broken function replaces the real one.
    function : str
        The name of the real function there.
    broken : callable
        The real function minus the ordering.
    models : tuple of str
        The models under which the explorer must report violations.
    expect : str
        Part of the problem each of these models must report at least once.
    """

    name: str
    scenario: str
    module: object
    function: str
    broken: Callable
    models: tuple[str, ...]
    expect: str

    def install(
        self, mp: pytest.MonkeyPatch, recorder: Recorder, spans: list[range]
    ) -> None:
        """Patch the broken function in; each call adds to ``spans`` its operations.

        A ``module`` of ``None`` means the recorder itself (a storage method);
        ``broken`` is then called with the recorder to make the method.
        """
        broken = self.broken
        owner = self.module
        if owner is None:
            owner, broken = recorder, broken(recorder)

        @functools.wraps(broken)
        def run(*args, **kwargs):
            start = len(recorder.log.ops)
            try:
                return broken(*args, **kwargs)
            finally:
                spans.append(range(start, len(recorder.log.ops)))

        mp.setattr(owner, self.function, run)


BREAKAGES = [
    Breakage(
        "payload-named-before-record",
        "first-save",
        commit,
        "write_new",
        _write_new_named_first,
        ("posix", "ordered"),
        "left without a valid record",
    ),
    Breakage(
        "overlapped-record-data-not-fsynced",
        "first-save",
        commit,
        "write_new",
        _write_new_overlapped_without("sync_file"),
        ("posix",),
        "left without a valid record",
    ),
    Breakage(
        "payload-named-before-record-name-durable",
        "first-save",
        commit,
        "write_new",
        _write_new_overlapped_without("sync_dir"),
        ("posix",),
        "left without a valid record",
    ),
    Breakage(
        "mirrored-pointer-not-fsynced",
        "mirrors",
        publishing,
        "_write_pointers",
        _write_pointers_unsynced,
        ("posix",),
        "the mirrored pointer is empty",
    ),
    Breakage(
        "mirrors-moved-before-d-fsynced",
        "mirrors",
        publishing,
        "publish",
        _publish_mirrors_with_d,
        ("posix",),
        "which is not there",
    ),
    Breakage(
        "make-dirs-without-parent-fsync",
        "first-save",
        None,
        "make_dirs",
        _make_dirs_without_parent_fsync,
        ("posix",),
        "latest finds nothing although the save returned",
    ),
    Breakage(
        "prune-records-with-payloads",
        "prune",
        pruning,
        "remove_payloads",
        _remove_records_with_payloads,
        ("posix",),
        "left without a valid record",
    ),
    Breakage(
        "resave-final-record-first",
        "resave",
        commit,
        "rewrite",
        _rewrite_record_first,
        ("posix", "ordered"),
        "latest went back to step 1 from 2",
    ),
    Breakage(
        "archive-in-one-batch",
        "archive",
        archiving,
        "archive",
        _archive_in_one_batch,
        ("posix",),
        "left without a valid record",
    ),
]

#: The most distinct states a breakage test checks per model.
BREAKAGE_SAMPLE = 24


def sample(states: list[CrashState], limit: int, seed: str) -> list[CrashState]:
    """At most ``limit`` of ``states``: those once the save returned, then a sample.

    The sample is drawn with a fixed seed and kept in the order of ``states``.
    """
    if len(states) <= limit:
        return states
    returned = [i for i, s in enumerate(states) if s.returned]
    others = [i for i, s in enumerate(states) if not s.returned]
    rng = random.Random(seed)
    drawn = rng.sample(others, max(0, limit - len(returned)))
    return [states[i] for i in sorted(returned[:limit] + drawn)]


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda b: b.name)
def test_explorer_catches_a_broken_ordering(breakage, tmp_path, capsys):
    """With one ordering of the store taken out, the explorer reports violations.

    The states checked are those of a crash while the broken function runs
    (after one of its operations) or once the save returned: the states of a
    crash before it are the unbroken code's, which ``test_crash_states``
    checks. Of more than :data:`BREAKAGE_SAMPLE` distinct states, every one
    after the save returned and a seeded sample of the others are checked.
    """
    pm = plugin_manager()
    scenario = next(s for s in SCENARIOS if s.name == breakage.scenario)
    spans: list[range] = []
    log = record(
        scenario,
        tmp_path / "recorded",
        pm,
        alter=lambda mp, recorder: breakage.install(mp, recorder, spans),
    )
    window = {point for span in spans for point in span}
    assert window, f"{breakage.function} was not called or did nothing"
    explorer = Explorer(scenario, log, tmp_path / "state", pm)
    generators = {
        "posix": lambda: posix_states(log, breakage.name),
        "ordered": lambda: ordered_states(log),
    }
    counts, missing = [], []
    for model in breakage.models:
        states = distinct(
            s for s in generators[model]() if s.point in window or s.returned
        )
        chosen = sample(states, BREAKAGE_SAMPLE, f"{breakage.name}:{model}")
        _, found = explorer.explore(model, chosen)
        counts.append(
            f"{model} {len(chosen)} of {len(states)} checked, {len(found)} violations"
        )
        if not any(breakage.expect in v for v in found):
            missing.append(model)
    summary = (
        f"broken {breakage.name}: {breakage.scenario} ({len(log.ops)} ops, "
        f"{breakage.function} issued ops {min(window)}-{max(window)}) "
        f"{', '.join(counts)}"
    )
    with capsys.disabled():
        print(f"\n{summary}")
    assert not missing, f"{summary}; no {breakage.expect!r} under {missing}"


# -- the models themselves ----------------------------------------------------


def _rename_log(*, fsync_file: bool, fsync_dir: bool) -> Log:
    """``a.tmp`` created and written, maybe fsynced, renamed to ``a``."""
    log = Log()
    inode = log.add("file")
    log.ops += [Op("create", "a.tmp", inode), Op("write", "a.tmp", inode, data=b"x")]
    if fsync_file:
        log.ops.append(Op("fsync", "a.tmp", inode))
    log.ops.append(Op("rename", "a.tmp", inode, dst="a"))
    if fsync_dir:
        log.ops.append(Op("fsync_dir", "."))
    return log


def _final_trees(states: Iterable[CrashState]) -> set[tuple]:
    return {
        tuple(sorted((p, c) for p, (_, c) in s.tree.items() if p != "."))
        for s in states
        if s.returned
    }


def test_posix_model_loses_what_was_not_fsynced():
    """Without fsyncs, a renamed file may be gone, empty, or under either name."""
    log = _rename_log(fsync_file=False, fsync_dir=False)
    assert _final_trees(posix_states(log, "t")) == {
        (),
        (("a.tmp", b""),),
        (("a.tmp", b"x"),),
        (("a", b""),),
        (("a", b"x"),),
    }
    assert _final_trees(ordered_states(log)) == {(("a", b"x"),)}


def test_posix_model_keeps_what_was_fsynced():
    """Data fsynced before the rename, directory fsynced after: only the end state."""
    log = _rename_log(fsync_file=True, fsync_dir=True)
    assert _final_trees(posix_states(log, "t")) == {(("a", b"x"),)}
    prefixes = [s.tree for s in ordered_states(log)]
    assert [sorted(t) for t in prefixes] == [
        ["."],
        [".", "a.tmp"],
        [".", "a.tmp"],
        [".", "a.tmp"],
        [".", "a"],
        [".", "a"],
    ]


def test_posix_model_drops_entries_of_a_directory_not_made_durable():
    """A file in a new directory is lost with it until the parent is fsynced."""
    log = Log()
    folder, inode = log.add("dir"), log.add("file")
    log.ops += [
        Op("mkdir", "d", folder),
        Op("create", "d/f", inode),
        Op("write", "d/f", inode, data=b"y"),
        Op("fsync", "d/f", inode),
        Op("fsync_dir", "d"),
    ]
    assert _final_trees(posix_states(log, "t")) == {(), (("d", None), ("d/f", b"y"))}
