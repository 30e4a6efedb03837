"""What a ``dp`` command says about checkpoints: few lines, each one actionable.

- one start-up line: plugin version, ``save_dir``, retention, verify mode;
- one line per ``--restart`` / ``--init-model`` / ``--finetune``: the
  checkpoint chosen, how it was found and how it was checked;
- one line per save (every family of one step together): step, size,
  seconds and MB/s, from :class:`SaveReport`, an ``on_commit`` observer;
- one closing line naming where the latest checkpoint really is.

They come beside deepmd-kit's own lines, which all stay, in their order
(``Saved model to`` included): the plugin adds lines and removes none; the
lines deepmd-kit's ``main`` says before a command are said by
:func:`say_main_lines`, since the plugin's ``main`` runs in its place. The
core says nothing at ``INFO`` per commit; what it returns
carries structured fields (a restart's ``rule``, ``via``, ``fell_back``), so
no line of the core's is read here. Paths are shown normalized, relative to
the working directory when they lie below it (:func:`shown`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..markers import hookimpl
from ..text import guard_logger
from .host import descriptor

log = logging.getLogger("dp_ckpt_plugin")


def shown(path: str | os.PathLike, cwd: Path | None = None) -> str:
    """A path for a message: normalized, relative to ``cwd`` when below it."""
    cwd = Path(cwd or Path.cwd())
    absolute = os.path.normpath(os.path.join(cwd, os.fspath(path)))
    try:
        relative = os.path.relpath(absolute, cwd)
    except ValueError:  # another drive
        return absolute
    return absolute if relative.startswith(os.pardir) else relative


# -- start-up ---------------------------------------------------------------------


def describe_retention(training: Mapping[str, Any]) -> str:
    """deepmd-kit's retention keys in words (``keep the newest 5``)."""
    ratio = training.get("ckpt_keep_ratio")
    if ratio is not None:
        return f"keep the newest {float(ratio):.0%} of the run's checkpoints"
    count = int(training.get("max_ckpt_keep", 5))
    text = "keep all" if count < 1 else f"keep the newest {count}"
    ema = training.get("ema_ckpt_keep")
    if training.get("enable_ema") and ema is not None and int(ema) != count:
        text += f" (EMA: {'all' if int(ema) < 1 else int(ema)})"
    return text


def describe_archive(folders: Iterable, max_archives: int | None) -> str:
    """What ``save_dir/archive/`` holds, in words (empty when nothing to say)."""
    folders = list(folders)
    keep = "" if max_archives is None else f"keep the newest {max_archives}"
    if not folders:
        return f"archive: {keep}" if keep else ""
    size = human_size(sum(f.size for f in folders))
    text = f"archive: {len(folders)} earlier run(s), {size}"
    return f"{text} ({keep})" if keep else text


def startup_line(
    settings, host: str, cwd: Path | None = None, *, archived: Iterable = ()
) -> str:
    """The one line a training run starts with.

    ``archived`` are the archive folders of ``save_dir`` (earlier runs).
    """
    from .. import __version__

    options = settings.options
    head = f"dp_ckpt_plugin {__version__} (dp {descriptor(host).flag})"
    stop = (
        f"stop with a checkpoint on {', '.join(options.stop_signals)}"
        if options.stop_signals
        else "no stop signals"
    )
    if "SIGINT" in options.stop_signals:
        stop += " (a second Ctrl-C aborts)"
    if settings.save_dir is None:
        return (
            f"{head}: no save_dir, deepmd-kit's own layout beside "
            f"{shown(settings.save_ckpt, cwd)} with atomic writes (set "
            f"training.save_dir for commit records, verified restarts and "
            f"retention by the plugin); {stop}"
        )
    archive = describe_archive(archived, options.max_archives)
    where = shown(settings.save_dir, cwd)
    if settings.save_url is not None:
        where = f"{settings.save_url} (staged in {where})"
    return (
        f"{head}: save_dir {where}, "
        f"{describe_retention(settings.training)}, verify {options.verify}, "
        f"lock {'on' if options.lock else 'off'}, "
        f"async_save {'on' if options.async_save else 'off'}, "
        f"{archive + ', ' if archive else ''}{stop}"
    )


# -- restarts ---------------------------------------------------------------------

_CHECKED = {
    "digest": "size and digest match its commit record",
    "size": "size matches its commit record (digest not checked: verify is size)",
    "unverified": "unverified: it has no commit record",
}
#: How a file without a commit record was checked, before what it carries.
_NO_RECORD = "no commit record; "


def describe_how(found, cwd: Path | None = None) -> str:
    """Which rule found a checkpoint (its ``rule`` and ``via``), with paths short."""
    via = shown(found.via, cwd) if found.via is not None else None
    if found.rule == "file":
        return "named explicitly"
    if found.rule in ("pointer", "alias", "link") and via is not None:
        return f"through the {found.rule} {via}"
    if found.rule == "newest" and via is not None:
        return f"as the newest committed checkpoint in {via}"
    return found.how


def describe_checked(found) -> str:
    """How a resolved checkpoint (its ``checked``, ``carried``) was checked, in words."""
    carried = getattr(found, "carried", None)
    if found.record is None and carried is not None:
        return _NO_RECORD + carried.describe()
    return _CHECKED.get(found.checked, found.checked)


def restart_line(
    option: str,
    spec: str,
    found,
    cwd: Path | None = None,
    *,
    adopted: Iterable[Path] = (),
    archives: bool = False,
) -> str:
    """The line saying which checkpoint ``--<option> <spec>`` resolved to, and why."""
    step = f" (step {found.step})" if found.step is not None else ""
    text = (
        f"--{option} {spec}: {shown(found.path, cwd)}{step}, "
        f"{describe_how(found, cwd)}; {describe_checked(found)}"
    )
    if found.path in set(adopted):
        text += " (adopted from plain deepmd-kit: it loads with torch and now has one)"
    if found.fell_back or found.moved_aside:
        text += "; newer candidates were unusable (see the warnings above)"
    if archives:
        text += (
            "; this run starts its own step count, so the checkpoints in save_dir "
            "are an earlier run's and go to save_dir/archive/ at the first save"
        )
    return text


# -- saves ------------------------------------------------------------------------


def human_size(size: float) -> str:
    """Bytes in decimal units: ``80.3 kB``, ``1.2 GB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


@dataclass
class _Save:
    start: float
    families: set[str]
    background: bool
    paused: float | None = None
    done: list = field(default_factory=list)


class SaveReport:
    """``on_commit`` observer writing one line per save of all its families.

    The trainer calls :meth:`begin` before handing the payloads to the store;
    the line is written when the last family of that step is committed, so
    it works the same for background saves.
    """

    def __init__(self, cwd: Path | None = None) -> None:
        self.cwd = cwd
        self._saves: dict[int, _Save] = {}
        self._mutex = threading.Lock()
        #: The checkpoint of the last save reported: (step, path of the first family).
        self.last: tuple[int, Path] | None = None

    def begin(self, step: int, families: Iterable[str], *, background: bool) -> None:
        """Note that a save of ``step`` for ``families`` starts now."""
        with self._mutex:
            self._saves[step] = _Save(time.monotonic(), set(families), background)

    def handed_over(self, step: int) -> None:
        """Note that the training loop goes on (a background save was queued)."""
        with self._mutex:
            save = self._saves.get(step)
            if save is not None and save.background:
                save.paused = time.monotonic() - save.start

    @hookimpl
    def on_commit(self, checkpoint) -> None:
        """Write the save's line once every family of its step is committed."""
        with self._mutex:
            save = self._saves.get(checkpoint.step)
            if save is None:
                return
            save.done.append(checkpoint)
            if not save.families <= {c.family for c in save.done}:
                return
            del self._saves[checkpoint.step]
        seconds = max(time.monotonic() - save.start, 1e-6)
        size = sum(c.record.size for c in save.done if c.record is not None)
        first, *rest = save.done
        names = [shown(first.path, self.cwd), *(c.path.name for c in rest)]
        line = save_line(
            checkpoint.step,
            names,
            size,
            seconds,
            background=save.background,
            paused=save.paused,
        )
        log.info("%s", line)
        self.last = (checkpoint.step, first.path)


def save_line(
    step: int,
    names: Iterable[str],
    size: int,
    seconds: float,
    *,
    background: bool = False,
    paused: float | None = None,
) -> str:
    """The line of one save: its files, size, time and rate."""
    how = ""
    if background:
        pause = f"{paused:.3f}" if paused is not None else "?"
        how = f" in the background (training paused {pause} s)"
    return (
        f"saved step {step}: {' + '.join(names)}, {human_size(size)} in "
        f"{seconds:.3f} s{how}, {size / seconds / 1e6:.1f} MB/s"
    )


def finished_line(report: SaveReport | None, store, cwd: Path | None = None) -> str:
    """Where the latest checkpoint is, for the end of a run with ``save_dir``."""
    pointer = shown(store.directory / store.primary.pointer, cwd)
    if report is None or report.last is None:
        return f"training ended without a new checkpoint; {pointer} is unchanged"
    step, path = report.last
    where, freeze = shown(path, cwd), shown(store.directory, cwd)
    remote = store.remote
    if remote is not None:
        sent = remote.sent_url(Path(path).name)
        where = sent or f"{where} (its upload to {remote.url} is not done)"
        pointer, freeze = f"{remote.url}/HEAD", remote.url
    return (
        f"training ended; the latest checkpoint is {where} (step {step}), named "
        f"by {pointer}: continue with --restart latest or freeze with "
        f"freeze -c {freeze}"
    )


# -- deepmd-kit's own lines ------------------------------------------------------------


def say_main_lines(host: str) -> None:
    """Say what deepmd-kit's ``main`` of ``host`` says before a command.

    The plugin's ``main`` runs ``train``, ``freeze`` and ``change-bias`` in
    place of deepmd-kit's; these are the lines deepmd-kit's would have said
    first (``DeePMD version: 3.2.0``), on its logger, so its log keeps every
    line of deepmd-kit's, in order (the host descriptor's ``main_lines``).
    """
    from deepmd import __version__

    found = descriptor(host)
    logger = logging.getLogger(found.deepmd_main)
    for level, message in found.main_lines:
        logger.log(
            logging.getLevelName(level), "%s", message.format(version=__version__)
        )


def say_saved(host: str, path: str | os.PathLike) -> None:
    """deepmd-kit's ``Saved model to <path>``, on the logger of ``host``'s trainer.

    For a host whose periodic save the plugin makes in place of deepmd-kit's
    (``dp --pt-expt``): the line deepmd-kit's save would have said.
    """
    logging.getLogger(descriptor(host).trainer).info(f"Saved model to {path}")


class ShortPaths(logging.Filter):
    """Show the paths a record carries as :func:`shown` does (the store's lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                shown(a) if isinstance(a, Path) else a for a in record.args
            )
        return True


def shorten_paths() -> None:
    """Attach :class:`ShortPaths` to the plugin's logger (once), the guard last.

    Only the plugin's own logger is filtered: deepmd-kit's lines are never
    changed, demoted or dropped.
    """
    plugin = logging.getLogger("dp_ckpt_plugin")
    if not any(isinstance(f, ShortPaths) for f in plugin.filters):
        plugin.addFilter(ShortPaths())
        guard_logger()  # the one-line guard formats last, short paths included


# -- the loggers a command configures ------------------------------------------------


def command_loggers() -> list[str]:
    """The loggers a ``dp`` command of the plugin configures.

    deepmd-kit's (``set_log_handles``: handlers, level, ``propagate``) and
    the plugin's (:func:`~dp_ckpt_plugin.deepmd.cli.share_deepmd_handlers`,
    :class:`ShortPaths`).
    """
    return ["deepmd", "dp_ckpt_plugin"]


@contextlib.contextmanager
def scoped_logging(names: Iterable[str]):
    """Put the loggers ``names`` back as they were when the block ends.

    Their handlers, level, ``propagate`` and filters; a handler added
    meanwhile (deepmd-kit's log file) is flushed and closed. A ``dp``
    command called from Python (a notebook, a test) leaves the caller's
    logging as it found it.
    """
    saved = [
        (logger, [*logger.handlers], logger.level, logger.propagate, [*logger.filters])
        for logger in map(logging.getLogger, names)
    ]
    try:
        yield
    finally:
        for logger, handlers, level, propagate, filters in saved:
            for handler in logger.handlers:
                if handler not in handlers:
                    with contextlib.suppress(Exception):
                        handler.flush()
                        handler.close()
            logger.handlers = handlers
            logger.setLevel(level)
            logger.propagate = propagate
            logger.filters = filters
