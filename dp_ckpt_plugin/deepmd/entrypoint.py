"""deepmd-kit's pt_expt training pipeline, with checkpoints through the store.

Each step of deepmd-kit's ``PTExptTrainEntrypoint`` that concerns checkpoints is
overridden; the rest is inherited:

``prepare_options``
    Runs before deepmd-kit reads anything. Starts the process group under
    ``torchrun`` (gloo without a GPU), reads the input once to validate
    ``training.save_dir`` and the ``dp_ckpt`` section, opens the store (taking
    its lock) and resolves ``--restart``/``--init-model`` through
    ``on_resolve_restart``, so a bad handle fails in seconds. The resolved path
    is handed on as is: ``latest`` is never turned into ``latest.pt``.
``load_config``
    Removes the ``dp_ckpt`` section before deepmd-kit's strict check.
``setup_run`` / ``teardown_run``
    Keep the process group made above; close the store at the end.
``run_training``
    Builds the trainer from :func:`.trainer.make_trainer_class`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from deepmd.common import j_loader
from deepmd.pt_expt.entrypoints.main import PTExptTrainEntrypoint
from deepmd.pt_expt.train import training

from ..argcheck import plugin_options
from ..errors import ConfigError
from ..layout import Family
from ..plugins import get_plugin_manager
from ..ranks import current_ranks
from ..retention import KeepLast
from ..store import CheckpointStore, FamilyConfig, resolve_on_chief
from .settings import SUFFIX, RunSettings, read_settings
from .trainer import make_trainer_class


class CheckpointTrainEntrypoint(PTExptTrainEntrypoint):
    """``dp --pt-expt train`` with dp_ckpt_plugin's store, resolution and lock."""

    def __init__(self) -> None:
        super().__init__()
        self.pm = get_plugin_manager()
        self.settings: RunSettings | None = None
        self.store: CheckpointStore | None = None
        self.resumed_from: Path | None = None
        self._made_group = False

    # -- before anything is built -------------------------------------------
    def prepare_options(self, options):
        self._made_group = start_process_group()
        ranks = current_ranks()
        self.settings = read_settings(load_input(options.input_file))
        if self.settings.save_dir is not None:
            self.store = build_store(self.settings, self.pm, ranks)
            self.store.open()  # the chief takes the lock now, not after the build
        ctx = self.settings.resolve_context(chief=ranks.rank == 0)
        resolved = {}
        for field in ("restart", "init_model"):
            spec = getattr(options, field)
            if spec is not None:
                found = resolve_on_chief(
                    self.pm, spec, ctx if ranks.rank == 0 else None, ranks
                )
                resolved[field] = str(found.path)
                self.resumed_from = found.path
        return replace(options, **resolved)

    def load_config(self, input_file: str) -> dict[str, Any]:
        config = super().load_config(input_file)
        plugin_options(config)  # validated already; removed before the strict check
        return config

    # -- the run ------------------------------------------------------------
    def setup_run(self, options, config) -> None:
        super().setup_run(options, config)
        self._owns_process_group = self._owns_process_group or self._made_group

    def run_training(self, config, options, neighbor_stat) -> None:
        trainer_class = make_trainer_class(
            self.store, config["training"], resumed_from=self.resumed_from
        )
        with swapped(training, "Trainer", trainer_class):
            super().run_training(config, options, neighbor_stat)

    def teardown_run(self, options, config) -> None:
        try:
            super().teardown_run(options, config)
        finally:
            if self.store is not None:
                self.store.close()


def load_input(input_file: str) -> dict[str, Any]:
    """Read the training input as deepmd-kit does, with a clear error if it cannot."""
    if not Path(input_file).is_file():
        raise ConfigError(f"training input {input_file} does not exist")
    try:
        return j_loader(input_file)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"training input {input_file} cannot be read: {exc}") from exc


def build_store(settings: RunSettings, pm, ranks) -> CheckpointStore:
    """The store of ``save_dir``: the periodic and EMA families and their compat links.

    Retention windows are set by the trainer once the run length is known.
    """
    family = Family(settings.save_ckpt.name, SUFFIX)
    ema = family.ema()
    compat = settings.options.compat_links
    prefix_dir = settings.cwd / settings.save_ckpt.parent
    configs = [
        FamilyConfig(
            family,
            KeepLast(5),
            compat_pointer=settings.cwd / "checkpoint" if compat else None,
            compat_alias=prefix_dir / family.alias if compat else None,
        ),
        FamilyConfig(
            ema, KeepLast(5), compat_alias=prefix_dir / ema.alias if compat else None
        ),
    ]
    return CheckpointStore(
        settings.save_dir,
        backend="torch",
        pm=pm,
        families=configs,
        ranks=ranks,
        durable=settings.options.fsync,
        lock=settings.options.lock,
        check_free_space=settings.options.check_free_space,
    )


def start_process_group() -> bool:
    """Under torchrun, start the process group now; gloo where there is no GPU.

    deepmd-kit 3.2 asks for ``cuda:nccl,cpu:gloo``, which fails without a GPU.
    Returns whether a group was started here.
    """
    if os.environ.get("LOCAL_RANK") is None:
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return False
    dist.init_process_group(
        backend="cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
    )
    return True


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any):
    """Set ``owner.name`` to ``value`` for the duration of a ``with`` block."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)
