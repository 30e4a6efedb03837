"""Everything a training run checks before deepmd-kit builds anything.

:func:`prepare_run` reads the input once, validates ``training.save_dir`` and
the plugin's options (``training._dp_ckpt``), opens the store (taking its
lock on the chief), adopts the numbered checkpoints plain deepmd-kit left in
it (:mod:`.adopt`) and resolves ``--restart``/``--init-model``/``--finetune``
through the store's resolve (the front door, ``on_resolve_restart``). It
imports neither torch nor deepmd-kit's training code (torch only to adopt
files, when there are any), so a single-process run reports a bad
configuration or restart handle within a second; under ``torchrun`` it runs
after the process group is up, and rank 0's resolution is broadcast to every
rank.

Each checkpoint a handle names is read once and verified from those bytes;
the run keeps them (:class:`~.loading.ServedPayloads`) for deepmd-kit's
loaders, which read them instead of the file. Other ranks read the file once
and check it at the level the chief did.

A preflight that fails closes the store: the lock and its holder file are
removed, and a ``save_dir`` this run created (still empty) is removed too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pluggy

from ..checkpoint.provenance import input_digest, read_input
from ..errors import CheckpointError, ConfigError, UnreadableFileError
from ..plugin.hooks import Hooks
from ..ranks import Ranks
from ..resolution import ResolveContext, Resolved, payload_of, resolve_restart
from ..storage import default_storage
from ..store.archive import archive_folders
from ..store.core import CheckpointStore
from .adopt import adopt
from .checkpointing import HostRun
from .exact import KEY as EXACT_KEY
from .host import descriptor, plugin_manager
from .loading import ServedPayloads
from .logs import SaveReport, restart_line, startup_line
from .metrics import check_host_support
from .naming import primary_family_in
from .origin import Changes, changes_since, run_origin
from .preempt import StopSignals
from .runtime import world_size
from .settings import RunSettings, is_directory, normalized_spec, read_settings

log = logging.getLogger("dp_ckpt_plugin")

#: Name under which the save report observes commits.
REPORT_PLUGIN = "dp_ckpt.deepmd.save_report"
#: The command-line options that name a checkpoint, in the order resolved.
HANDLES = ("init_model", "restart", "finetune")


def prepare_training(host: str, input_file: str, handles, ranks: Ranks) -> HostRun:
    """The preflight of ``dp --<host> train``: :func:`prepare_run` with its plugins.

    ``handles`` is anything with ``restart``, ``init_model`` and ``finetune``
    (deepmd-kit's parsed flags, or its train entrypoint's options).
    """
    return prepare_run(
        input_file,
        restart=handles.restart,
        init_model=handles.init_model,
        finetune=handles.finetune,
        pm=plugin_manager(host),
        ranks=ranks,
        host=host,
    )


def prepare_run(
    input_file: str,
    *,
    restart: str | None,
    init_model: str | None,
    pm: pluggy.PluginManager,
    ranks: Ranks,
    host: str,
    finetune: str | None = None,
) -> HostRun:
    """Validate, lock, adopt and resolve; see the module docstring.

    Returns the run its trainer takes part in, with the resolved handles
    (``restart``, ``init_model``, ``finetune``) to hand to deepmd-kit.

    Raises
    ------
    CheckpointError
        A configuration error, a held lock or a restart that resolves to nothing.
    Stopped
        A stop signal came meanwhile.
    """
    config = load_input(input_file)
    settings = read_settings(config, suffix=descriptor(host).suffix)
    check_host_support(descriptor(host), settings.options, settings.training)
    chief = ranks.rank == 0
    origin = None
    if chief:
        archived = _archived(settings)
        log.info("%s", startup_line(settings, host, settings.cwd, archived=archived))
        origin = run_origin(
            config, cwd=settings.cwd, backend=host, world_size=world_size()
        )
    options = settings.options
    run = HostRun(
        None,
        settings.training,
        background=options.async_save,
        stop=StopSignals(options.stop_signals).install(),
        cwd=settings.cwd,
        retention=options.retention,
        host=host,
        exact_resume=options.exact_resume,
        payloads=ServedPayloads(keep=(EXACT_KEY,)),  # read from deepmd-kit's load
        settings=settings,
        chief=chief,
    )
    store = None
    created = False
    try:
        adopted: list[Path] = []
        if settings.save_dir is not None:
            run.store = store = build_store(settings, pm, ranks, host)
            if origin is not None:
                _describe(store, *origin)
            created = chief and store.storage.entry(store.directory) is None
            store.open()  # the chief takes the lock now, not after the build
            if settings.options.async_save:  # it starts while the model is built
                store.start_writer()
            if chief:
                adopted = [c.path for c in adopt(store, cwd=settings.cwd)]
        ctx = settings.resolve_context() if chief else None
        specs = {"init_model": init_model, "restart": restart, "finetune": finetune}
        resolved: dict[str, str] = {}
        for key in HANDLES:
            spec = specs[key]
            if spec is None:
                continue
            spec_path = normalized_spec(spec, settings.cwd)
            context = _context_for(spec_path, ctx)
            continues = key == "restart"
            # through the store when there is one, which protects what it finds
            # from retention and forgets what it moved into quarantine
            if store is None:
                found = resolve_restart(Hooks.of(pm), spec_path, context, ranks)
            else:
                found = store.resolve(spec_path, context=context, continues=continues)
            run.payloads.add(payload_of(found, store.storage if store else None))
            resolved[key] = str(found.path)
            run.resumed_from = found.path
            # a restart continues the run's step count; an initialization or
            # a fine-tuning starts its own, so the checkpoints in save_dir are
            # an earlier run's, archived before the first save
            archives = (
                store is not None
                and not continues
                and _inside(found.path, store.directory)
            )
            if chief:
                for warning in found.warnings:
                    log.warning("%s", warning)
                line = restart_line(
                    key.replace("_", "-"),
                    spec,
                    found,
                    settings.cwd,
                    adopted=adopted,
                    archives=archives,
                )
                log.info("%s", line)
            if continues:
                run.changes = ranks.broadcast(
                    _changes(found, origin, store) if chief else None
                )
                if chief:
                    for line in run.changes.lines:
                        log.info("changed since step %s: %s", found.step, line)
                    if run.changes.unknown:
                        log.info("%s", run.changes.unknown)
        run.init_model, run.restart, run.finetune = map(resolved.get, HANDLES)
        if store is not None:
            run.report = SaveReport(settings.cwd)
            if pm.get_plugin(REPORT_PLUGIN) is not None:  # a second run, same manager
                pm.unregister(name=REPORT_PLUGIN)
            pm.register(run.report, name=REPORT_PLUGIN)
        return run
    except BaseException:
        run.close()
        if created:
            store.storage.remove_dir(store.directory)  # only if still empty
        raise


def _describe(store: CheckpointStore, provenance, normalized) -> None:
    """What every record of the run says of its origin; an input that is not JSON is not kept."""
    try:
        store.committer.describe_origin(provenance, normalized)
    except ValueError as exc:
        log.warning("the training input is not kept with the checkpoints: %s", exc)
        store.committer.describe_origin(provenance)


def _changes(found: Resolved, origin, store: CheckpointStore | None) -> Changes:
    """What changed from the origin of the checkpoint ``found`` to this run's."""
    provenance, normalized = origin
    old = found.record.provenance if found.record is not None else None
    old_input = None
    if old is not None and old.input is not None:
        storage = store.storage if store is not None else default_storage()
        old_input = read_input(found.path.parent, old.input, storage=storage)
        if old_input is None and store is not None and store.remote is not None:
            # another node staged it
            old_input = store.remote.read_input(old.input)
    try:
        new = replace(provenance, input=input_digest(normalized))
    except (TypeError, ValueError):  # not JSON: compared key by key only
        new = provenance
    return changes_since(old, old_input, new, normalized)


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
    if ctx is None or spec == "latest" or not is_directory(Path(spec)):
        return ctx
    family = primary_family_in(Path(spec), ctx.family.suffix, ctx.family)
    return ctx if family == ctx.family else replace(ctx, family=family)


def _inside(path: Path, directory: Path) -> bool:
    return Path(os.path.abspath(path)).parent == Path(os.path.abspath(directory))


def load_input(input_file: str) -> dict[str, Any]:
    """Read the training input as deepmd-kit does, with a clear error if it cannot."""
    from deepmd.common import j_loader

    try:
        found = default_storage().entry(Path(input_file), follow=True)
    except UnreadableFileError as exc:
        raise ConfigError(f"training input {exc}") from None
    if found is None or not found.is_file:
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
    uploaded by a :class:`~dp_ckpt_plugin.remote.replica.RemoteStore`
    (:func:`~dp_ckpt_plugin.remote.factory.open_remote`).
    """
    remote = None
    if settings.save_url is not None:
        from ..remote.factory import open_remote

        opts = settings.options.remote
        _, remote = open_remote(
            settings.save_url,
            format=descriptor(host).format,
            directory=settings.save_dir,  # its staging directory, chosen by settings
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
