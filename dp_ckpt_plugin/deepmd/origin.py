"""Where a run comes from, and what changed since the checkpoint it restarts from.

:func:`run_origin` makes the provenance of a deepmd-kit run (rule 51): the
training input as deepmd-kit normalizes it (``update_deepmd_input`` and
``normalize``, no file written), its digest, and the identity of every
training and validation system: its path and a cheap fingerprint, the
names and sizes of its files and the digests of its small ones
(``type.raw``, ``type_map.raw``, ``nopbc``), read through the storage.

:func:`changes_since` compares a checkpoint's provenance and input with this
run's, before anything is built (rule 52): one line per change, saying what
it means; a change of the data means the data position cannot be restored.
Keys that do not change the trajectory (display, saving, logging) are not
changes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.limits import MAX_INT, is_int
from ..checkpoint.provenance import (
    DataIdentity,
    DataSystem,
    Provenance,
    digest_bytes,
    input_changes,
    provenance_of,
    value_text,
)
from ..errors import UnreadableFileError
from ..storage import default_storage, entry_or_none

#: Small files of a system whose content is digested (others: size only).
SMALL_FILES = ("type.raw", "type_map.raw", "nopbc")
#: Most directories searched for systems under one ``systems`` string.
MAX_SEARCHED = 2000
#: Most change lines said (the rest counted).
MAX_LINES = 20
#: Keys of the input that do not change the trajectory of a run.
QUIET_KEYS = {
    f"training.{k}"
    for k in (
        "disp_file",
        "disp_freq",
        "save_freq",
        "save_ckpt",
        "save_dir",
        "max_ckpt_keep",
        "ckpt_keep_ratio",
        "ema_ckpt_keep",
        "disp_training",
        "time_training",
        "disp_avg",
        "profiling",
        "profiling_file",
        "enable_profiler",
        "tensorboard",
        "tensorboard_log_dir",
        "tensorboard_freq",
        "stat_file",
        "stat_file_mode",
    )
}
#: Sections whose keys are not changes at all (validation reporting).
QUIET_SECTIONS = ("validating.",)


def normalized_input(config: Mapping[str, Any]) -> dict[str, Any]:
    """The input as deepmd-kit normalizes it (the plugin's own section dropped).

    An input deepmd-kit refuses is kept as given: deepmd-kit says why later.
    """
    from deepmd.utils.argcheck import normalize
    from deepmd.utils.compat import update_deepmd_input

    raw = copy.deepcopy(dict(config))
    raw.pop("dp_ckpt", None)
    try:
        multi_task = "model_dict" in raw.get("model", {})
        return normalize(update_deepmd_input(raw, warning=False), multi_task=multi_task)
    except Exception:  # deepmd-kit reports a bad input itself, later
        return copy.deepcopy(dict(config))


def data_systems(config: Mapping[str, Any], cwd: Path) -> list[tuple[str, str]]:
    """``(role, path)`` of every training and validation system the input names."""
    training = config.get("training")
    if not isinstance(training, Mapping):
        return []  # deepmd-kit says what is wrong with the input
    sections = [training]
    if isinstance(training.get("data_dict"), Mapping):
        sections = [v for v in training["data_dict"].values() if isinstance(v, Mapping)]
    found: list[tuple[str, str]] = []
    for section in sections:
        for role, key in (
            ("training", "training_data"),
            ("validation", "validation_data"),
        ):
            data = section.get(key)
            systems = data.get("systems") if isinstance(data, Mapping) else None
            if isinstance(systems, str):
                systems = _expand(systems, cwd)
            if not isinstance(systems, list | tuple):
                continue
            for path in systems:
                if isinstance(path, str):
                    found.append((role, os.path.normpath(path)))
    return found


def _expand(path: str, cwd: Path) -> list[str]:
    """The systems under ``path`` (directories holding ``type.raw``), as deepmd-kit finds them."""
    base = cwd / path
    if _names(base) is None:
        return [path]  # a file (HDF5, LMDB) or missing: the path itself
    found, todo, searched = [], [(base, path)], 0
    while todo and searched < MAX_SEARCHED:
        here, shown = todo.pop()
        searched += 1
        names = _names(here) or []
        if any(n == "type.raw" for n, _ in names):
            found.append(shown)
            continue
        todo.extend(
            (here / n, f"{shown}/{n}") for n, kind in sorted(names) if kind == "dir"
        )
    return sorted(found) or [path]


def _names(path: Path) -> list[tuple[str, str]] | None:
    """The entries of the directory ``path``; ``None`` if it is none or cannot be read."""
    entry = entry_or_none(path, follow=True)
    if entry is None or not entry.is_dir:
        return None
    try:
        return default_storage().names(path)
    except UnreadableFileError:
        return None


def fingerprint(path: Path) -> str:
    """A cheap digest of a system: names and sizes of its files, small files' content."""
    lines: list[str] = []
    names = _names(path)
    if names is None:
        size = _size(path)
        lines.append("missing" if size < 0 else f"file {size}")
    else:
        for name, kind in sorted(names):
            if kind == "dir":
                for inner, _ in sorted(_names(path / name) or []):
                    lines.append(f"{name}/{inner} {_size(path / name / inner)}")
                continue
            line = f"{name} {_size(path / name)}"
            if name in SMALL_FILES:
                try:
                    data = default_storage().read_small(path / name)
                except UnreadableFileError:
                    data = None
                line += f" {digest_bytes(data) if data is not None else '-'}"
            lines.append(line)
    return digest_bytes("\n".join(lines).encode("utf-8"))


def _size(path: Path) -> int:
    """The size of ``path`` (links followed); -1 where nothing can be read."""
    entry = entry_or_none(path, follow=True)
    return entry.size if entry is not None else -1


def data_identity(config: Mapping[str, Any], cwd: Path) -> DataIdentity:
    """Every system the input names, with its fingerprint."""
    return DataIdentity.of(
        DataSystem(role, path, fingerprint(cwd / path))
        for role, path in data_systems(config, cwd)
    )


def run_origin(
    config: Mapping[str, Any], *, cwd: Path, backend: str, world_size: int
) -> tuple[Provenance, dict[str, Any]]:
    """The provenance of a run of ``config`` and its normalized input."""
    normalized = normalized_input(config)
    training = normalized.get("training")
    seed = training.get("seed") if isinstance(training, Mapping) else None
    if not is_int(seed, MAX_INT, -MAX_INT):
        seed = None  # a seed the record cannot hold is not recorded
    provenance = provenance_of(
        world_size=world_size,
        backend=backend,
        seed=seed,
        data=data_identity(normalized, cwd),
    )
    return provenance, normalized


# -- what changed --------------------------------------------------------------------


@dataclass
class Changes:
    """What changed since a checkpoint, one line each.

    Attributes
    ----------
    lines : list of str
        Each change and what it means, the most telling first.
    data : str or None
        Why the data position cannot be restored (the data changed).
    unknown : str or None
        Why what changed cannot be told (the checkpoint records too little).
    """

    lines: list[str] = field(default_factory=list)
    data: str | None = None
    unknown: str | None = None


def _line(key: str, old: Any, new: Any) -> tuple[str, bool]:
    """The line of one changed key, and whether it changes the data."""
    change = f"{key} {value_text(old)} -> {value_text(new)}"
    data = key.startswith(
        ("training.training_data", "training.validation_data", "training.data_dict")
    )
    if key == "training.numb_steps":
        why = ", the learning-rate schedule and loss prefactors follow numb_steps"
    elif key == "training.seed":
        why = ", a run of this input draws other random numbers"
    elif key.startswith("model."):
        why = (
            ": the model changed (parameters that do not fit are refused when the "
            "trainer is built)"
        )
    elif key.split(".")[0] in ("learning_rate", "loss", "optimizer"):
        why = ": the optimization differs from the checkpoint's"
    elif data:
        why = ": the data changed, its position cannot be restored"
    else:
        why = ""
    return change + why, data


def _quiet(key: str) -> bool:
    return key in QUIET_KEYS or key.startswith(QUIET_SECTIONS) or "._" in f".{key}"


def changes_since(
    old: Provenance | None,
    old_input: Mapping[str, Any] | None,
    new: Provenance,
    new_input: Mapping[str, Any],
) -> Changes:
    """What changed from a checkpoint's origin (``old``) to this run's."""
    found = Changes()
    if old is None:
        found.unknown = (
            "the checkpoint records no provenance (written by plain deepmd-kit or an "
            "earlier dp-ckpt-plugin): a change of numb_steps, the model or the "
            "data cannot be seen"
        )
        return found
    data_changed = False
    if old_input is not None:
        for key, before, after in input_changes(old_input, new_input):
            if key.endswith(".systems") or _quiet(key):
                continue  # systems: compared with their fingerprints, below
            line, is_data = _line(key, before, after)
            found.lines.append(line)
            data_changed |= is_data
    elif old.input is not None and old.input != new.input:
        found.lines.append(
            "the training input differs from the checkpoint's (its input is not "
            "kept beside it, so what changed cannot be told)"
        )
    data_lines = _data_lines(old.data, new.data)
    found.lines.extend(data_lines)
    if data_lines or data_changed:
        found.data = "the data changed since the checkpoint"
    if old.world_size != new.world_size:
        found.lines.append(
            f"world size {old.world_size} -> {new.world_size}: each rank draws "
            "other batches"
        )
    for name, key, why in (
        ("backend", "backend", "another trainer continues the run"),
        ("deepmd-kit", "deepmd_kit", "another trainer continues the run"),
        ("torch", "torch", "its kernels may round otherwise"),
    ):
        before, after = getattr(old, key), getattr(new, key)
        if before is not None and after is not None and before != after:
            found.lines.append(f"{name} {before} -> {after}: {why}")
    if old_input is None and old.seed != new.seed:
        found.lines.append(
            f"training.seed {old.seed} -> {new.seed}, a run of this input draws "
            "other random numbers"
        )
    if len(found.lines) > MAX_LINES:
        more = len(found.lines) - MAX_LINES + 1
        found.lines[MAX_LINES - 1 :] = [
            f"and {more} more changes (dp-ckpt diff shows them all)"
        ]
    return found


def _data_lines(old: DataIdentity | None, new: DataIdentity | None) -> list[str]:
    if old is None or new is None or old.digest == new.digest:
        return []
    lost = "the data position cannot be restored"
    if not old.systems or not new.systems:
        return [f"data systems changed ({old.count} -> {new.count} systems): {lost}"]
    before = {(s.role, s.path): s.fingerprint for s in old.systems}
    after = {(s.role, s.path): s.fingerprint for s in new.systems}
    lines = []
    for key in sorted(set(before) | set(after)):
        role, path = key
        if key not in before:
            what = "added"
        elif key not in after:
            what = "removed"
        elif before[key] != after[key]:
            what = "changed (its files differ)"
        else:
            continue
        lines.append(f"{role} system {path} {what}: {lost}")
    if not lines:  # same systems, another order
        lines.append(f"data systems reordered: {lost}")
    return lines
