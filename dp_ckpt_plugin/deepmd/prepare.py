"""Everything a training run checks before deepmd-kit builds anything.

:func:`prepare_run` reads the input once, validates ``training.save_dir`` and
the ``dp_ckpt`` section, opens the store (taking its lock on the chief) and
resolves ``--restart``/``--init-model`` through ``on_resolve_restart``. It
imports neither torch nor deepmd-kit's training code, so a single-process run
reports a bad configuration or restart handle within a second; under
``torchrun`` it runs after the process group is up, and rank 0's resolution is
broadcast to every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from ..errors import ConfigError
from ..ranks import Ranks
from ..resolution import resolve_restart
from ..store import CheckpointStore
from .settings import RunSettings, read_settings


@dataclass
class PreparedRun:
    """The outcome of :func:`prepare_run`.

    Attributes
    ----------
    settings : RunSettings
        The checkpoint part of the input.
    store : CheckpointStore or None
        The store of ``save_dir`` (open and locked on the chief), if set.
    restart, init_model : str or None
        The resolved checkpoint paths to hand to deepmd-kit.
    resumed_from : Path or None
        The checkpoint the run starts from.
    """

    settings: RunSettings
    store: CheckpointStore | None
    restart: str | None
    init_model: str | None
    resumed_from: Path | None


def prepare_run(
    input_file: str,
    *,
    restart: str | None,
    init_model: str | None,
    pm: pluggy.PluginManager,
    ranks: Ranks,
) -> PreparedRun:
    """Validate, lock and resolve; see the module docstring.

    Raises
    ------
    CheckpointError
        A configuration error, a held lock or a restart that resolves to nothing.
    """
    settings = read_settings(load_input(input_file))
    store = None
    if settings.save_dir is not None:
        store = build_store(settings, pm, ranks)
        store.open()  # the chief takes the lock now, not after the build
    chief = ranks.rank == 0
    ctx = settings.resolve_context(chief=chief) if chief else None
    resolved: dict[str, str | None] = {"restart": None, "init_model": None}
    resumed_from = None
    for key, spec in (("init_model", init_model), ("restart", restart)):
        if spec is not None:
            found = resolve_restart(pm, spec, ctx, ranks)
            resolved[key] = str(found.path)
            resumed_from = found.path
            if store is not None:
                # a restart continues the run's step count; an initialization
                # starts its own, so the checkpoints in save_dir are an
                # earlier run's, archived before the first save
                store.protect_resumed(found.path, continues=key == "restart")
    return PreparedRun(
        settings, store, resolved["restart"], resolved["init_model"], resumed_from
    )


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
    settings: RunSettings, pm: pluggy.PluginManager, ranks: Ranks
) -> CheckpointStore:
    """The store of ``save_dir``, with the families :class:`RunSettings` describes."""
    return CheckpointStore(
        settings.save_dir,
        format="torch",
        pm=pm,
        families=settings.family_configs(),
        ranks=ranks,
        durable=settings.options.fsync,
        lock=settings.options.lock,
        check_free_space=settings.options.check_free_space,
    )
