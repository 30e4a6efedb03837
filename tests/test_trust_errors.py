"""Class 5, walked whole: every error the OS can give, at every step.

Every system call the store makes goes through the storage layer's ``_sys_*``
methods (and the file handle a format writes to through ``_wrap_handle``).
Each scenario below is run once to count its mutating calls (creating,
writing, fsyncing, renaming, linking, removing, making a directory), then
once per call and per error number, that call failing with that error.

Each failed run must end in one of two ways:

- the operation raises :class:`~dp_ckpt_plugin.errors.CheckpointWriteError`
  (never a bare ``OSError``, ``FileExistsError`` or anything else) whose
  message names a path and the cause (``os.strerror`` of the error), or
- it succeeds, when the failing call was one whose failure the store is
  allowed to swallow (the informative manifest, a quarantine that could not
  move the corrupt file, removing a leftover), and then it did its job.

And in both cases nothing is lost: with the fault gone, a new manager
restores ``latest`` as a step that was committed, with the payload saved for
it; the next save works; and no temporary file is left once a store opened.

Scenarios: a first save into a new directory, a steady save that prunes, a
re-save of a step, a save that archives an earlier run, a restore that
quarantines a corrupt newest checkpoint, and ``dp-ckpt prune``. Errors:
``ENOSPC``, ``EIO``, ``EACCES``, ``EROFS``, ``EDQUOT``, ``EPERM``. The number
of cases is printed (several hundred).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import (
    is_temp,
    make_payload,
    open_manager,
    payload_mismatches,
    plugin_manager,
)

from dp_ckpt_plugin.commands import main as dp_ckpt
from dp_ckpt_plugin.errors import (
    CheckpointError,
    CheckpointWriteError,
    RestartNotFoundError,
)
from dp_ckpt_plugin.storage.local import LocalStorage

ERRORS = [errno.ENOSPC, errno.EIO, errno.EACCES, errno.EROFS, errno.EDQUOT, errno.EPERM]
#: The mutating system calls of the storage layer, by method.
CALLS = (
    "_sys_fsync",
    "_sys_fsync_dir",
    "_sys_rename",
    "_sys_unlink",
    "_sys_mkdir",
    "_sys_rmdir",
    "_sys_symlink",
    "_sys_link",
)
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT
#: Files whose failed write or removal a store may swallow: they inform (the
#: manifest, the lock's holder note), or are leftovers (the lock file at
#: release, a temporary file being cleaned up).
SWALLOWED = (".dp_ckpt.store.json", ".dp_ckpt.holder.json", ".dp_ckpt.lock", ".tmp-")


class Faults:
    """Count the storage's mutating calls; make the ``fail_at``-th one fail.

    Patched into :class:`LocalStorage` itself, so every storage of the run
    (the store's, the lock's, a command's) goes through it.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.kinds: list[str] = []
        self.fail_at: int | None = None
        self.code = errno.EIO
        self.failed: str | None = None
        for name in CALLS:
            real = getattr(LocalStorage, name)
            monkeypatch.setattr(LocalStorage, name, self._wrap(name, real))
        real_open = LocalStorage._sys_open

        def sys_open(storage, path, flags, mode=0o644):
            if flags & _WRITING:
                self._step(f"open {path}", path)
            return real_open(storage, path, flags, mode)

        monkeypatch.setattr(LocalStorage, "_sys_open", sys_open)
        real_wrap = LocalStorage._wrap_handle
        faults = self

        class Handle:
            def __init__(self, handle, path):
                self._handle, self._path = handle, path

            def write(self, data):
                faults._step(f"write {self._path}", self._path)
                return self._handle.write(data)

            def __getattr__(self, name):
                return getattr(self._handle, name)

        monkeypatch.setattr(
            LocalStorage,
            "_wrap_handle",
            lambda storage, handle, path: Handle(
                real_wrap(storage, handle, path), path
            ),
        )

    def _wrap(self, name: str, real: Callable) -> Callable:
        def call(storage, *args):
            path = args[-1] if name in ("_sys_fsync", "_sys_symlink") else args[0]
            self._step(f"{name[5:]} {path}", path)
            return real(storage, *args)

        return call

    def _step(self, what: str, path) -> None:
        index = self.count
        self.count += 1
        self.kinds.append(what.split()[0])
        if index == self.fail_at:
            self.failed = what
            raise OSError(self.code, os.strerror(self.code), str(path))

    def arm(self, index: int | None, code: int = errno.EIO) -> None:
        self.count, self.fail_at, self.code, self.failed = 0, index, code, None
        self.kinds: list[str] = []


@dataclass(frozen=True)
class Scenario:
    """What is prepared (no faults), and the operation run under faults.

    ``saved`` maps a step to the payload versions saved for it by the time
    the operation ends (a failed operation may leave either).
    """

    name: str
    prepare: Callable[[Path], None]
    operate: Callable[[Path], None]
    saved: dict[int, tuple[int, ...]]
    #: What ``latest`` may be afterwards (a failed operation: the old one;
    #: ``None``: nothing, when nothing was committed before).
    latest: tuple[int | None, ...]
    #: Whether the operation may swallow a fault (and then must succeed).
    may_succeed: bool = False
    #: Steps of an earlier run that must stay whole, in D or in D/archive/*/.
    earlier_run: tuple[int, ...] = ()


def payload(step: int, version: int = 0) -> dict:
    return make_payload(step + 1000 * version)


def _save(directory: Path, steps, *, keep=0, version=0) -> None:
    with open_manager(directory, max_keep=keep, pm=plugin_manager()) as m:
        for step in steps:
            m.save(step, payload(step, version))


def _prepare_nothing(d: Path) -> None:
    return None


def _prepare_two(d: Path) -> None:
    _save(d, [1, 2], keep=2)


def _prepare_earlier_run(d: Path) -> None:
    _save(d, [1, 2, 3])


def _prepare_corrupt_newest(d: Path) -> None:
    _save(d, [1, 2, 3])
    newest = d / "model.ckpt-3.h5"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))


def _first_save(d: Path) -> None:
    _save(d, [1])


def _pruning_save(d: Path) -> None:
    with open_manager(d, max_keep=2, pm=plugin_manager()) as m:
        m.restore("latest")
        m.save(3, payload(3))


def _resave(d: Path) -> None:
    with open_manager(d, max_keep=0, pm=plugin_manager()) as m:
        m.save(3, payload(3))
        m.save(3, payload(3, 1))


def _archiving_save(d: Path) -> None:
    _save(d, [1], version=1)  # a fresh run: the earlier one is archived


def _quarantining_restore(d: Path) -> None:
    with open_manager(d, max_keep=0, verify="digest", pm=plugin_manager()) as m:
        restored = m.restore("latest")
    assert restored.step == 2, restored.step


def _command_prune(d: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = dp_ckpt(["prune", str(d), "--keep-last", "1", "--json"])
    if code != 0:  # its one line, as a write error of the command
        lines = err.getvalue().splitlines()
        if code != 1 or len(lines) != 1 or not lines[0].startswith("dp-ckpt: error: "):
            raise RuntimeError(f"dp-ckpt prune: exit status {code}, {lines}")
        raise CheckpointWriteError(lines[0])


SCENARIOS = [
    Scenario("first-save", _prepare_nothing, _first_save, {1: (0,)}, (1, None)),
    Scenario(
        "pruning-save", _prepare_two, _pruning_save, {1: (0,), 2: (0,), 3: (0,)}, (2, 3)
    ),
    Scenario("resave", _prepare_nothing, _resave, {3: (0, 1)}, (3, None)),
    Scenario(
        "archiving-save",
        _prepare_earlier_run,
        _archiving_save,
        {1: (0, 1), 2: (0,), 3: (0,)},
        # a fresh run moves the earlier one into D/archive/ before its first
        # save: if that save fails, D holds nothing, and the earlier run is
        # whole in the archive
        (1, 3, None),
        earlier_run=(1, 2, 3),
    ),
    Scenario(
        "quarantining-restore",
        _prepare_corrupt_newest,
        _quarantining_restore,
        {1: (0,), 2: (0,), 3: (0,)},
        (2,),
        may_succeed=True,
    ),
    Scenario(
        "dp-ckpt-prune",
        _prepare_earlier_run,
        _command_prune,
        {1: (0,), 2: (0,), 3: (0,)},
        (3,),
    ),
]


def check_after(scenario: Scenario, d: Path) -> list[str]:
    """With no fault: ``latest`` is a committed step holding its payload; a save works."""
    problems = []
    try:
        with open_manager(d, max_keep=0, verify="digest", pm=plugin_manager()) as m:
            try:
                restored = m.restore("latest")
            except RestartNotFoundError:
                if None not in scenario.latest:
                    raise
                restored = None
            if restored is None:
                pass
            elif restored.step not in scenario.latest:
                problems.append(f"latest is step {restored.step}")
            elif not any(
                not payload_mismatches(restored.state, restored.step + 1000 * v)
                for v in scenario.saved.get(restored.step, (0,))
            ):
                problems.append(f"latest (step {restored.step}) holds another payload")
            m.save(99, payload(99))
        for step in scenario.earlier_run:
            name = f"model.ckpt-{step}.h5"
            places = [d / name, *sorted(d.glob(f"archive/*/{name}"))]
            if not any(_holds(p, step) for p in places):
                problems.append(f"the earlier run's step {step} is lost")
        leftovers = [n for n in os.listdir(d) if is_temp(n)]
        if leftovers:
            problems.append(f"temporary files left: {leftovers}")
    except Exception as exc:  # the next run must work
        problems.append(f"the next run failed: {type(exc).__name__}: {exc}")
    return problems


def _copy(template: Path, dest: Path) -> None:
    """A copy of the prepared store (links as links), or nothing if there is none."""
    dest.parent.mkdir(parents=True)
    if template.exists():
        shutil.copytree(template, dest, symlinks=True)


def _holds(path: Path, step: int) -> bool:
    """Whether ``path`` is committed (its record verifies) and holds step's payload."""
    try:
        with open_manager(
            path.parent, max_keep=0, verify="digest", lock=False, pm=plugin_manager()
        ) as m:
            restored = m.restore(str(path))
    except Exception:
        return False
    return restored.resolved.checked == "digest" and not payload_mismatches(
        restored.state, step
    )


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_every_os_error_at_every_step(scenario, tmp_path, monkeypatch, capsys):
    faults = Faults(monkeypatch)
    template = tmp_path / "template" / "D"
    faults.arm(None)
    scenario.prepare(template)
    probe = tmp_path / "probe" / "D"
    _copy(template, probe)
    faults.arm(None)
    scenario.operate(probe)
    steps, kinds = faults.count, list(faults.kinds)
    assert steps > 0, "the operation made no call: nothing was tested"
    # every error at every call; a format's many writes into one file take
    # the errors in turn (the write path is the same for each)
    plan = [
        (index, code)
        for index, kind in enumerate(kinds)
        for code in (ERRORS if kind != "write" else [ERRORS[index % len(ERRORS)]])
    ]
    problems, cases = [], 0
    for index, code in plan:
        cases += 1
        d = tmp_path / f"{errno.errorcode[code]}-{index}" / "D"
        _copy(template, d)
        faults.arm(index, code)
        where = f"{scenario.name}, {errno.errorcode[code]} at call {index}"
        try:
            scenario.operate(d)
            error = None
        except CheckpointError as exc:
            error = exc
        except Exception as exc:  # anything else is a crash
            problems.append(f"{where} ({faults.failed}): {type(exc).__name__}: {exc}")
            continue
        finally:
            capsys.readouterr()
        faults.arm(None)
        if (
            error is None
            and faults.failed is not None
            and not scenario.may_succeed
            and not any(n in faults.failed for n in SWALLOWED)
        ):
            problems.append(f"{where} ({faults.failed}): succeeded silently")
        if error is not None:
            text = str(error)
            if not isinstance(error, CheckpointWriteError):
                problems.append(f"{where}: {type(error).__name__}: {text}")
            elif os.strerror(code) not in text:
                problems.append(f"{where}: the cause is not named: {text}")
        problems += [f"{where}, afterwards: {p}" for p in check_after(scenario, d)]
    with capsys.disabled():
        print(
            f"\nOS errors: {scenario.name}: {steps} calls ({kinds.count('write')} "
            f"writes), {cases} cases"
        )
    assert not problems, f"{len(problems)} of {cases} cases:\n" + "\n".join(
        problems[:15]
    )
