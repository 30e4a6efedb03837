"""Everything a training run checks before deepmd-kit builds anything.

:func:`prepare_run` reads the input once, validates ``training.save_dir`` and
the plugin's options (``training._dp_ckpt``), opens the store (taking its
lock on the chief), adopts the numbered checkpoints plain deepmd-kit left in
it (:mod:`.adopt`) and resolves ``--restart``/``--init-model``/``--finetune``
through ``on_resolve_restart``. It imports neither torch nor deepmd-kit's
training code (torch only to adopt files, when there are any), so a
single-process run reports a bad configuration or restart handle within a
second; under ``torchrun`` it runs after the process group is up, and rank
0's resolution is broadcast to every rank.

A preflight that fails closes the store: the lock and its holder file are
removed, and a ``save_dir`` this run created (still empty) is removed too.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pluggy

from ..archive import archive_folders
from ..errors import CheckpointError, ConfigError
from ..hooks import Hooks
from ..ranks import Ranks
from ..resolution import ResolveContext, resolve_restart
from ..storage import default_storage
from ..store import CheckpointStore
from .adopt import adopt
from .host import descriptor
from .logs import SaveReport, restart_line, startup_line
from .metrics import check_host_support
from .naming import primary_family_in
from .preempt import StopSignals
from .settings import RunSettings, normalized_spec, read_settings

log = logging.getLogger("dp_ckpt_plugin")

#: Name under which the save report observes commits.
REPORT_PLUGIN = "dp_ckpt.deepmd.save_report"
#: The command-line options that name a checkpoint, in the order resolved.
HANDLES = ("init_model", "restart", "finetune")


@dataclass
class PreparedRun:
    """The outcome of :func:`prepare_run`.

    Attributes
    ----------
    settings : RunSettings
        The checkpoint part of the input.
    store : CheckpointStore or None
        The store of ``save_dir`` (open and locked on the chief), if set.
    restart, init_model, finetune : str or None
        The resolved checkpoint paths to hand to deepmd-kit.
    resumed_from : Path or None
        The checkpoint the run starts from.
    report : SaveReport or None
        The observer writing one line per save (with a store).
    stop : StopSignals or None
        The stop signals, installed (``None`` when none are configured).
    """

    settings: RunSettings
    store: CheckpointStore | None
    restart: str | None
    init_model: str | None
    resumed_from: Path | None
    finetune: str | None = None
    report: SaveReport | None = None
    stop: StopSignals | None = None
    adopted: list[Path] = field(default_factory=list)
    host: str | None = None

    def close(self) -> None:
        """Restore the signal handlers and close the store (idempotent)."""
        try:
            if self.stop is not None:
                self.stop.restore()
        finally:
            if self.store is not None:
                self.store.close()


def prepare_run(
    input_file: str,
    *,
    restart: str | None,
    init_model: str | None,
    pm: pluggy.PluginManager,
    ranks: Ranks,
    host: str,
    finetune: str | None = None,
) -> PreparedRun:
    """Validate, lock, adopt and resolve; see the module docstring.

    Raises
    ------
    CheckpointError
        A configuration error, a held lock or a restart that resolves to nothing.
    Stopped
        A stop signal came meanwhile.
    """
    settings = read_settings(load_input(input_file), suffix=descriptor(host).suffix)
    check_host_support(descriptor(host), settings.options, settings.training)
    chief = ranks.rank == 0
    if chief:
        log.info(
            "%s",
            startup_line(settings, host, settings.cwd, archived=_archived(settings)),
        )
    stop = StopSignals(settings.options.stop_signals).install()
    store = None
    created = False
    try:
        adopted: list[Path] = []
        if settings.save_dir is not None:
            store = build_store(settings, pm, ranks, host)
            created = chief and not os.path.lexists(store.directory)
            store.open()  # the chief takes the lock now, not after the build
            if settings.options.async_save:  # it starts while the model is built
                store.start_writer()
            if chief:
                adopted = [c.path for c in adopt(store, cwd=settings.cwd)]
        ctx = settings.resolve_context(chief=chief) if chief else None
        if ctx is not None and store is not None:
            ctx = replace(ctx, storage=store.storage, verifier=None)
        specs = {"init_model": init_model, "restart": restart, "finetune": finetune}
        resolved: dict[str, str | None] = dict.fromkeys(HANDLES)
        resumed_from = None
        for key in HANDLES:
            spec = specs[key]
            if spec is None:
                continue
            spec_path = normalized_spec(spec, settings.cwd)
            if store is not None and store.remote is not None:
                # HEAD of the remote store, fetched into this node's staging
                found = store.resolve(
                    spec_path,
                    digest=settings.options.verify != "size",
                    continues=key == "restart",
                )
            else:
                found = resolve_restart(
                    Hooks.of(pm), spec_path, _context_for(spec_path, ctx), ranks
                )
            resolved[key] = str(found.path)
            resumed_from = found.path
            continues = key == "restart"
            archives = False
            if store is not None:
                # a restart continues the run's step count; an initialization
                # or a fine-tuning starts its own, so the checkpoints in
                # save_dir are an earlier run's, archived before the first save
                store.protect_resumed(found.path, continues=continues)
                archives = not continues and _inside(found.path, store.directory)
            if chief:
                for warning in found.warnings:
                    log.warning("%s", warning)
                log.info(
                    "%s",
                    restart_line(
                        key.replace("_", "-"),
                        spec,
                        found,
                        settings.cwd,
                        adopted=adopted,
                        archives=archives,
                    ),
                )
        report = None
        if store is not None:
            report = SaveReport(settings.cwd)
            if pm.get_plugin(REPORT_PLUGIN) is not None:  # a second run, same manager
                pm.unregister(name=REPORT_PLUGIN)
            pm.register(report, name=REPORT_PLUGIN)
        return PreparedRun(
            settings,
            store,
            resolved["restart"],
            resolved["init_model"],
            resumed_from,
            finetune=resolved["finetune"],
            report=report,
            stop=stop,
            adopted=adopted,
            host=host,
        )
    except BaseException:
        stop.restore()
        if store is not None:
            store.close()
            if created:
                with contextlib.suppress(OSError):
                    os.rmdir(store.directory)  # only if still empty
        raise


def _archived(settings: RunSettings) -> list:
    """The archives of earlier runs in ``save_dir``, for the start-up line."""
    if settings.save_dir is None:
        return []
    try:
        return archive_folders(
            settings.cwd / settings.save_dir, storage=default_storage()
        )
    except CheckpointError:
        return []  # unreadable: the store says so when it opens


def _context_for(spec: str, ctx: ResolveContext | None) -> ResolveContext | None:
    """The context for ``spec``: a directory is read with its own family.

    A store moved elsewhere, or written under another ``save_ckpt``, names
    its checkpoints by the prefix its commit records say, not this run's.
    """
    if ctx is None or spec == "latest" or not Path(spec).is_dir():
        return ctx
    family = primary_family_in(Path(spec), ctx.family.suffix, ctx.family)
    return ctx if family == ctx.family else replace(ctx, family=family)


def _inside(path: Path, directory: Path) -> bool:
    return Path(os.path.abspath(path)).parent == Path(os.path.abspath(directory))


def load_input(input_file: str) -> dict[str, Any]:
    """Read the training input as deepmd-kit does, with a clear error if it cannot."""
    from deepmd.common import j_loader

    if not Path(input_file).is_file():
        raise ConfigError(f"training input {input_file} does not exist")
    try:
        return j_loader(input_file)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"training input {input_file} cannot be read: {exc}") from exc


def build_store(
    settings: RunSettings, pm: pluggy.PluginManager, ranks: Ranks, host: str
) -> CheckpointStore:
    """The store of ``save_dir``, with the families :class:`RunSettings` describes.

    A ``save_dir`` on object storage is staged in a local directory and
    uploaded by a :class:`~dp_ckpt_plugin.remote.replica.RemoteStore`.
    """
    remote = None
    if settings.save_url is not None:
        from ..remote.replica import RemoteStore
        from ..storage.registry import storage_for

        opts = settings.options.remote
        remote = RemoteStore(
            storage_for(settings.save_url),
            format=descriptor(host).format,
            ttl=float(opts.get("lease_seconds", 60)),
            upload_wait=float(opts.get("upload_wait", 300)),
        )
    return CheckpointStore(
        settings.save_dir,
        format=descriptor(host).format,
        pm=pm,
        families=settings.family_configs(),
        ranks=ranks,
        durable=settings.options.fsync,
        lock=settings.options.lock,
        check_free_space=settings.options.check_free_space,
        max_archives=settings.options.max_archives,
        remote=remote,
    )
