"""Argument schemas of dp_ckpt_plugin, with their documentation.

DeePMD-kit 3.2.0 checks its training input with dargs in strict mode and
rejects keys it does not know, except those beginning with ``_``, which its
``normalize`` drops as comments. The plugin's options therefore live in
``training._dp_ckpt``, beside DeePMD-kit's own checkpoint keys, where every
``dp`` command accepts them: with the plugin on, with ``DP_CKPT_DISABLE=1``
and with the backends the plugin does not change::

    {
      "model": {...},
      "training": {
        "save_dir": "models",
        "_dp_ckpt": {"verify": "size", "fsync": false}
      }
    }

The top-level ``dp_ckpt`` section of 0.2 is refused in one line naming
``training._dp_ckpt``.

``training.save_dir`` stays where DeePMD-kit defines it; :func:`check_save_dir`
checks that it names a local directory that exists or can be created.

The schemas are functions returning dargs :class:`~dargs.Argument` objects;
the documentation renders them with dargs' Sphinx directive. Importing this
module imports neither torch nor deepmd-kit.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dargs import Argument
from dargs.dargs import ArgumentError, ArgumentKeyError

from ..errors import ConfigError, UnreadableFileError
from ..storage import default_storage, entry_or_none
from .retention_args import count_arg, retention_args

#: Key of the plugin's options inside the ``training`` section.
SECTION = "_dp_ckpt"
#: Where the options are, as error messages spell key paths.
SECTION_PATH = f"training/{SECTION}"
#: The top-level section of dp_ckpt_plugin 0.2, refused since 0.3.
OLD_SECTION = "dp_ckpt"
#: Ways a checkpoint can be checked before it is used.
VERIFY_CHOICES = ("size", "digest")
#: Signals that stop training with a checkpoint, unless the input says others.
DEFAULT_STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

_KEY_IN_MESSAGE = re.compile(r"key `([^`]+)`")
#: Marks "no value" where ``None`` is a valid value.
_MISSING = object()

# -- documentation of each option ---------------------------------------------

DOC_SECTION = (
    "Options of dp_ckpt_plugin, in the ``training`` section beside DeePMD-kit's "
    "own checkpoint keys (``save_dir``, ``save_ckpt``, ``max_ckpt_keep``). "
    "DeePMD-kit treats keys beginning with ``_`` as comments, so the same input "
    "runs unchanged with ``DP_CKPT_DISABLE=1`` and with backends the plugin "
    "does not change. Every option is optional; leave the section out to get "
    "the defaults. The top-level ``dp_ckpt`` section of dp_ckpt_plugin 0.2 "
    "is refused since 0.3: move it here."
)
DOC_VERIFY = (
    "How a checkpoint is checked before ``--restart``, ``--init-model`` or "
    "``dp freeze`` uses it. Its size is always compared with the size written "
    "in its commit record, which catches a write cut short. ``digest`` also "
    "re-reads the whole file and compares its digest (BLAKE3, or the sha256 "
    "of records written by dp-ckpt-plugin 0.1) with the record, which "
    "catches corruption that keeps the size (bad disk, partial copy). "
    "``size`` skips the hash, which saves one read of the file. The default is "
    "``digest``: ``--restart latest`` hashes the checkpoint by default because "
    "the file is about to be read in full anyway. A checkpoint that fails the "
    "check is treated as corrupt (see ``quarantine``)."
)
DOC_LOCK = (
    "Refuse to start a second run writing checkpoints into the same "
    "``save_dir`` while a first one is still running. The error names the "
    "process holding the directory. A lock left behind by a killed run does "
    "not block. Turn this off only if your file system does not support "
    "file locks."
)
DOC_FSYNC = (
    "Make every checkpoint, pointer and alias durable: flush it to disk "
    "before it counts as written, so a power loss or node crash cannot leave "
    "a checkpoint that is announced but empty. Turning this off makes saving "
    "faster; do it for scratch runs only."
)
DOC_QUARANTINE = (
    "When resolving a restart finds a checkpoint that is torn or corrupt, "
    "move it into ``<save_dir>/quarantine/`` and fall back to the previous "
    "committed checkpoint, with a warning naming both files. Quarantined "
    "files are never deleted; inspect or remove them yourself. When off, the "
    "corrupt file is left in place and still skipped."
)
DOC_CHECK_FREE_SPACE = (
    "Before writing a checkpoint, compare the free space in ``save_dir`` with "
    "the size of the previous checkpoint of the same family, and refuse to "
    "start writing when it would not fit. The previous checkpoints are left "
    "as they were and the error says how much space is free and how much is "
    "needed."
)
DOC_COMPAT_LINKS = (
    "When ``save_dir`` is set, also keep DeePMD-kit's own ``checkpoint`` pointer "
    "in the working directory and the ``<save_ckpt>.pt`` alias beside the "
    "``save_ckpt`` prefix up to date, as DeePMD-kit 3.2.0 does. Existing "
    "scripts and ``dp freeze`` run in the working directory keep working. The "
    "pointer and alias inside ``save_dir`` are kept whatever this says."
)
DOC_EXACT_RESUME = (
    "Make ``--restart`` continue the run exactly: each checkpoint also "
    "carries the random states (Python, NumPy, deepmd-kit's data sampling "
    "generator, torch) of every rank and the position of the data "
    "iteration (per data system, and per task in multi-task runs), under "
    "the payload key ``_dp_ckpt``, which plain deepmd-kit ignores. A run "
    "stopped at any saved step and restarted gives the same learning-curve "
    "rows and the same model as the run that was not stopped. The cost is "
    "about 20 kB per checkpoint and rank and about a millisecond per save "
    "(rule 34 of the guarantees). "
    "With ``dp --pt`` the training and validation batches are then drawn in "
    "the training process rather than in deepmd-kit's data-loader worker "
    "processes. Off: the checkpoint holds deepmd-kit's payload only and a "
    "restart draws fresh batches, as deepmd-kit does."
)

DOC_ASYNC_SAVE = (
    "Save checkpoints in the background. The training loop stops only while "
    "a copy of the model, optimizer and EMA state is taken (a memory copy "
    "into buffers reused from one save to the next); writing, hashing, "
    "fsyncing, committing, publishing and retention run in a background "
    "thread. At most one save is in flight: a save that comes while the "
    "previous one is still writing waits for it. An error of a background "
    "save ends the run at the next save, or at the end of training, never "
    "silently; training waits for the last save before it exits. Off by "
    "default."
)
DOC_STOP_SIGNALS = (
    "Signals that stop training cleanly, as clusters end jobs (Slurm sends "
    "``SIGTERM``, or ``SIGUSR1`` ahead of the wall time when asked with "
    "``--signal``) and as a person does (Ctrl-C, ``SIGINT``). On such a signal "
    "the current training step finishes, a checkpoint of that step is "
    "committed through the store (the run waits for a background save), and "
    "``dp`` exits with status 128 + the signal number (143 for ``SIGTERM``, "
    "138 for ``SIGUSR1``); after Ctrl-C it ends by ``SIGINT`` itself (130), so "
    "a calling script stops too. ``--restart latest`` continues from that "
    "step. Under ``torchrun`` every rank stops after the same step. A second "
    "``SIGTERM`` or ``SIGUSR1`` while stopping is ignored, so it cannot cut "
    "the save short; a second Ctrl-C aborts at once, keeping the last "
    "committed checkpoint. Names with or without ``SIG``, any case; ``[]`` "
    "leaves every signal's default action in place."
)
DOC_MAX_ARCHIVES = (
    "Keep at most this many archives of earlier runs in "
    "``<save_dir>/archive/`` (a new run that does not continue the one it "
    "finds there moves that run's checkpoints into a new archive instead of "
    "deleting them). Applied at the start of each run, after its archiving: "
    "the oldest archives beyond this number are removed, never the one "
    "holding the checkpoint the run starts from. ``null`` (the default) keeps "
    "every archive; ``dp-ckpt ls`` shows them with their sizes and "
    "``dp-ckpt prune --archives`` removes them by hand."
)
DOC_REMOTE = (
    "How a ``save_dir`` on object storage (``s3://bucket/run``, ``gs://``, "
    "``az://``) is written. Each checkpoint is committed in a local staging "
    "directory first, with every rule of a local ``save_dir``, then uploaded "
    "in the background: payload, commit record, then the store's HEAD, which "
    "names the latest checkpoint and moves only by compare-and-swap. One run "
    "writes a store at a time (a lease). Ignored for a local ``save_dir``."
)
DOC_STAGING_DIR = (
    "The local directory checkpoints are staged in before their upload: a "
    "folder per store is made in it. ``null`` (the default) uses "
    "``DP_CKPT_STAGING`` if set, else a folder of the system's temporary "
    "directory (node-local: the nodes of a run need not share a file system)."
)
DOC_UPLOAD_WAIT = (
    "Seconds the end of training (or a stop signal) waits for uploads still in "
    "flight before the run exits. What did not make it stays committed in the "
    "staging directory, is named in one line, and is uploaded by the next run "
    "on the node or by ``dp-ckpt sync``."
)
DOC_LEASE_SECONDS = (
    "Seconds the writer lease of the store holds without renewal; a live run "
    "renews it every third of that. A run killed on another host blocks the "
    "store for at most twice this long (a run on the same host takes over at "
    "once)."
)
DOC_SAVE_DIR = (
    "Directory for checkpoints, in the ``training`` section of the input "
    "(DeePMD-kit's own key). Numbered checkpoints go to "
    "``<save_dir>/<save_ckpt>-<step>.pt``, and the latest pointer and alias of "
    "each family live in it too, recorded relative to it: the directory is "
    "self-contained and can be moved or copied, and ``--restart <directory>`` "
    "keeps working. It must be a non-empty path naming a directory that "
    "exists or can be created; it is created on the first save. ``null`` "
    "(the default) keeps DeePMD-kit's layout, with checkpoints beside the "
    "``save_ckpt`` prefix."
)


# -- schemas --------------------------------------------------------------------


def _flag(name: str, doc: str, default: bool = True) -> Argument:
    """Return an optional boolean option."""
    return Argument(name, bool, optional=True, default=default, doc=doc)


def _path_or_null(name: str, doc: str) -> Argument:
    """Return an optional option holding a non-empty path or ``null``."""
    return Argument(
        name,
        [str, None],
        optional=True,
        default=None,
        doc=doc,
        extra_check=lambda value: value is None or bool(value.strip()),
        extra_check_errmsg="It must be a non-empty path or null.",
    )


def _seconds(name: str, default: int, least: int, most: float, doc: str) -> Argument:
    """Return an optional number of seconds, at least ``least``."""
    return Argument(
        name,
        [int, float],
        optional=True,
        default=default,
        doc=doc,
        extra_check=lambda value: least <= value < most,
        extra_check_errmsg=f"It must be a number of seconds, {least} or more.",
    )


def plugin_args() -> Argument:
    """Return the schema of the ``training/_dp_ckpt`` section.

    Returns
    -------
    dargs.Argument
        An optional dict whose options all have defaults.
    """
    remote = Argument(
        "remote",
        dict,
        [
            _path_or_null("staging_dir", DOC_STAGING_DIR),
            _seconds("upload_wait", 300, 0, 1e7, DOC_UPLOAD_WAIT),
            _seconds("lease_seconds", 60, 1, 1e6, DOC_LEASE_SECONDS),
        ],
        optional=True,
        default={},
        doc=DOC_REMOTE,
    )
    verify = Argument(
        "verify",
        str,
        optional=True,
        default="digest",
        doc=f"{DOC_VERIFY} Possible values: "
        + ", ".join(f"``{c}``" for c in VERIFY_CHOICES)
        + ".",
        extra_check=lambda value: value in VERIFY_CHOICES,
        extra_check_errmsg="It must be one of "
        + ", ".join(f"'{c}'" for c in VERIFY_CHOICES)
        + ".",
    )
    stop_signals = Argument(
        "stop_signals",
        list,
        optional=True,
        default=list(DEFAULT_STOP_SIGNALS),
        doc=DOC_STOP_SIGNALS,
        extra_check=lambda value: all(_signal_or_none(v) for v in value),
        extra_check_errmsg="Each entry must name a signal that can be caught, "
        "such as 'SIGTERM', 'SIGUSR1' or 'SIGINT'.",
    )
    return Argument(
        SECTION,
        dict,
        [
            verify,
            _flag("lock", DOC_LOCK),
            _flag("fsync", DOC_FSYNC),
            _flag("quarantine", DOC_QUARANTINE),
            _flag("check_free_space", DOC_CHECK_FREE_SPACE),
            _flag("compat_links", DOC_COMPAT_LINKS),
            _flag("async_save", DOC_ASYNC_SAVE, default=False),
            stop_signals,
            _flag("exact_resume", DOC_EXACT_RESUME),
            count_arg("max_archives", DOC_MAX_ARCHIVES),
            retention_args(),
            remote,
        ],
        optional=True,
        default={},
        doc=DOC_SECTION,
    )


def save_dir_args() -> Argument:
    """Return the schema of ``training.save_dir``: a non-empty path or ``None``."""
    return _path_or_null("save_dir", DOC_SAVE_DIR)


def gen_doc(**kwargs: Any) -> str:
    """Return the reStructuredText documentation of every schema.

    Parameters
    ----------
    **kwargs
        Passed to :meth:`dargs.Argument.gen_doc`.

    Returns
    -------
    str
        The ``_dp_ckpt`` section, then ``training.save_dir``.
    """
    return "\n\n".join(
        arg.gen_doc(**kwargs) for arg in (plugin_args(), save_dir_args())
    )


# -- options ----------------------------------------------------------------------


@dataclass(frozen=True)
class PluginOptions:
    """The ``training._dp_ckpt`` section, validated and with defaults filled in.

    Attributes
    ----------
    verify : str
        ``"size"`` or ``"digest"``.
    lock : bool
        Refuse a second writer on the same ``save_dir``.
    fsync : bool
        Make writes durable.
    quarantine : bool
        Move a corrupt checkpoint aside and fall back to the previous one.
    check_free_space : bool
        Refuse to start a write that would not fit.
    compat_links : bool
        Keep DeePMD-kit's working-directory pointer and alias up to date.
    async_save : bool
        Write checkpoints in a background thread.
    stop_signals : tuple of str
        Canonical names (``"SIGTERM"``) of the signals that stop training
        with a checkpoint.
    exact_resume : bool
        Carry the random and data state in each checkpoint and restore it
        at ``--restart``.
    max_archives : int or None
        How many archives of earlier runs to keep (``None``: all).
    retention : dict
        Retention beyond deepmd-kit's window (:mod:`.retention_args`).
    remote : dict
        ``staging_dir``, ``upload_wait`` and ``lease_seconds`` of a
        ``save_dir`` on object storage.
    """

    verify: str = "digest"
    lock: bool = True
    fsync: bool = True
    quarantine: bool = True
    check_free_space: bool = True
    compat_links: bool = True
    async_save: bool = False
    stop_signals: tuple[str, ...] = DEFAULT_STOP_SIGNALS
    exact_resume: bool = True
    max_archives: int | None = None
    retention: Mapping[str, Any] = field(default_factory=dict, hash=False)
    remote: Mapping[str, Any] = field(default_factory=dict, hash=False)


def plugin_options(config: dict) -> PluginOptions:
    """Read and validate the plugin's options from a whole training input.

    The options are ``training._dp_ckpt`` (DeePMD-kit drops it itself); the
    top-level ``dp_ckpt`` section of dp_ckpt_plugin 0.2 is refused.

    Parameters
    ----------
    config : dict
        The whole training input. On an error it is left as it was.

    Returns
    -------
    PluginOptions
        The options, with defaults for those not given.

    Raises
    ------
    ConfigError
        If the options are misplaced, not a dict, or have an
        unknown key or a bad value; the message names the key path, such as
        ``training/_dp_ckpt/verify``, and the closest known key for a typo.
    """
    if not isinstance(config, dict):
        raise ConfigError(
            f"the training input must be a JSON object, got {type(config).__name__}"
        )
    training = config.get("training")
    training = training if isinstance(training, dict) else {}
    check_placement(config, training)
    return _read_section(training.get(SECTION, {}))


def check_placement(config: dict, training: dict) -> None:
    """Refuse the plugin's options where nobody would read them.

    A top-level ``dp_ckpt`` (the section of 0.2), ``training.dp_ckpt``
    (DeePMD-kit rejects it), a top-level ``_dp_ckpt``
    (DeePMD-kit and the plugin would both ignore it) and a ``training`` key
    one typo away from ``_dp_ckpt`` holding options.
    """
    if OLD_SECTION in config:
        raise ConfigError(
            f"the top-level `{OLD_SECTION}` section is `training.{SECTION}` since 0.3"
        )
    if OLD_SECTION in training:
        raise ConfigError(
            f"invalid input at `training/{OLD_SECTION}`: DeePMD-kit does not accept "
            f"this key; the plugin's options go in `{SECTION_PATH}` (with the "
            "leading underscore)"
        )
    if SECTION in config:
        raise ConfigError(
            f"invalid input at `{SECTION}`: the plugin's options go in the "
            f"training section, as `{SECTION_PATH}`"
        )
    for key, value in training.items():
        if (
            key != SECTION
            and isinstance(key, str)
            and key.startswith("_")
            and isinstance(value, dict)
            and difflib.get_close_matches(key, [SECTION], n=1, cutoff=0.75)
        ):
            raise ConfigError(
                f"invalid input at `training/{key}`: unknown section. "
                f"Did you mean: {SECTION}?"
            )


def _read_section(section: Any) -> PluginOptions:
    """Check the section strictly, fill in defaults (``_`` keys dropped as comments)."""
    if not isinstance(section, dict):
        raise ConfigError(
            f"`{SECTION_PATH}` must be a JSON object of options, "
            f"got {type(section).__name__} {section!r}"
        )
    if section.get("verify") == "sha256":
        raise ConfigError(f"`{SECTION_PATH}/verify`: 'sha256' is 'digest' since 0.3")
    schema = plugin_args()
    try:
        values = schema.normalize_value(dict(section), trim_pattern="_*")
        schema.check_value(values, strict=True)
    except ArgumentError as exc:
        raise config_error(exc, section, list(schema.sub_fields)) from None
    names = (_signal_or_none(name).name for name in values["stop_signals"])
    values["stop_signals"] = tuple(dict.fromkeys(names))
    return PluginOptions(**values)


def _signal_or_none(name: Any) -> signal.Signals | None:
    """The catchable signal ``name`` names (``"TERM"``, ``"sigterm"``...), or ``None``."""
    if not isinstance(name, str):
        return None
    text = name.strip().upper()
    text = text if text.startswith("SIG") else "SIG" + text
    found = getattr(signal.Signals, text, None) if text.isidentifier() else None
    return None if found is None or found.name in ("SIGKILL", "SIGSTOP") else found


def config_error(exc: ArgumentError, value: Any, known: list[str]) -> ConfigError:
    """Turn a dargs error about the section ``value`` into one paragraph.

    The message starts with the full key path (``training/_dp_ckpt/verify``)
    and quotes the bad value, or lists the ``known`` keys for an unknown key
    dargs has no close match for.
    """
    message = " ".join((exc.message or str(exc)).split())
    keys = [k for k in exc.path.split("/") if k]
    found = _KEY_IN_MESSAGE.search(message)
    if found:
        keys.append(found.group(1))
    if isinstance(exc, ArgumentKeyError):
        if "Did you mean" not in message:
            message = f"{message} Known keys: {', '.join(known)}."
    elif (bad := _lookup(value, keys)) is not _MISSING:
        message = f"{message} (got {bad!r})"
    return ConfigError(
        f"invalid input at `{'/'.join([SECTION_PATH, *keys])}`: {message}"
    )


def _lookup(value: Any, keys: list[str]) -> Any:
    """Return ``value[k0][k1]...``, or ``_MISSING`` if any step is absent."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


# -- save_dir -------------------------------------------------------------------


def check_save_url(value: str, key: str = "training.save_dir") -> str:
    """Check a ``save_dir`` URL (``s3://bucket/run``); return it, normalized.

    Only its form is checked here (scheme, bucket, path): whether the bucket
    exists and the credentials are accepted is found when the store opens,
    before any model is built.
    """
    from ..objectstore.registry import remote_url

    try:
        return remote_url(value)
    except ValueError as exc:
        raise ConfigError(f"`{key}` is {value!r}: {exc}") from None


def check_save_dir(value: Any, key: str = "training.save_dir") -> Path | str | None:
    """Check a ``save_dir`` value without creating anything.

    Parameters
    ----------
    value : Any
        The value from the input: a path string or ``None``.
    key : str, optional
        Name of the key, for messages.

    Returns
    -------
    Path, str or None
        The path as given, the URL of a store on object storage
        (:func:`check_save_url`), or ``None`` when no directory is configured.

    Raises
    ------
    ConfigError
        If the value is not a string or ``None``, is empty, is a URL, names something
        that is not a directory, or names a directory that cannot be created
        or written to.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"`{key}` must be a directory path (a string) or null, "
            f"got {type(value).__name__} {value!r}"
        )
    if not value.strip():
        raise ConfigError(f"`{key}` must not be empty; give a directory path or null")
    if "\0" in value:
        raise ConfigError(f"`{key}` contains a NUL character: {value!r}")
    from ..objectstore.registry import check_not_mistyped, local_path

    try:
        found = local_path(value)
    except ConfigError as exc:
        raise ConfigError(f"`{key}`: {exc}") from None
    if found is None:
        return check_save_url(value.strip(), key)
    try:
        check_not_mistyped(value)
    except ConfigError as exc:
        raise ConfigError(f"`{key}` is {exc}") from None
    path = Path(found)
    _check_directory_usable(Path(os.path.abspath(path)), key)
    return path


def _check_directory_usable(path: Path, key: str) -> None:
    """Raise if ``path`` is not a writable directory and cannot be made one.

    One ``stat`` decides whether the path exists, so another process creating
    the directory meanwhile (the chief rank of the same run) is no error.
    Everything is asked of the storage.
    """
    storage = default_storage()
    try:
        found = storage.entry(path, follow=True)
    except UnreadableFileError as exc:
        raise ConfigError(f"`{key}`: {exc}") from None
    if found is not None and not found.is_dir:
        raise ConfigError(f"`{key}` names {path}, which exists but is not a directory")
    if found is not None:
        if not storage.writable(path):
            raise ConfigError(
                f"`{key}` names directory {path}, which is not writable by this user"
            )
        return
    link = entry_or_none(path, storage=storage)
    if link is not None and link.kind == "link":
        raise ConfigError(f"`{key}` names {path}, which is a broken symbolic link")
    ancestor = nearest_existing_ancestor(path)
    found = entry_or_none(ancestor, follow=True, storage=storage)
    cannot = f"`{key}`: directory {path} cannot be created because {ancestor}"
    if found is None or not found.is_dir:
        raise ConfigError(f"{cannot} is not a directory")
    if not storage.writable(ancestor):
        raise ConfigError(f"{cannot} is not writable by this user")


def nearest_existing_ancestor(path: Path) -> Path:
    """Return ``path`` or its closest parent that exists (links not followed).

    Parameters
    ----------
    path : Path
        An absolute path.

    Returns
    -------
    Path
        The first of ``path``, its parent, grandparent, ... that exists.
    """
    storage = default_storage()
    for candidate in (path, *path.parents):
        if entry_or_none(candidate, storage=storage) is not None:
            return candidate
    return Path(path.anchor)
