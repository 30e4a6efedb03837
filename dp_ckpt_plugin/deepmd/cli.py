"""``dp --pt-expt`` with dp_ckpt_plugin: train and freeze here, the rest as is.

A mistake of the user's (a bad ``save_dir``, an unknown option, a restart
handle that names nothing, a directory another run holds) ends with one
message and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..errors import CheckpointError

log = logging.getLogger("dp_ckpt_plugin")


def main(args: list[str] | argparse.Namespace | None = None) -> None:
    """Run a ``dp --pt-expt`` command (deepmd-kit's pt_expt ``main`` signature)."""
    from deepmd.main import parse_args

    flags = args if isinstance(args, argparse.Namespace) else parse_args(args=args)
    if flags.command not in ("train", "freeze"):
        from deepmd.pt_expt.entrypoints import main as pt_expt_main

        pt_expt_main.main(flags)
        return
    from deepmd.loggers.loggers import set_log_handles

    set_log_handles(
        flags.log_level, Path(flags.log_path) if flags.log_path else None, mpi_log=None
    )
    share_deepmd_handlers(log)
    try:
        if flags.command == "train":
            run_train(flags)
        else:
            from .pt_expt.freeze import run_freeze

            run_freeze(flags, plugin_manager())
    except CheckpointError as exc:
        log.error("%s", exc)
        sys.exit(1)


def run_train(flags: argparse.Namespace) -> None:
    """``dp --pt-expt train`` through :class:`.pt_expt.train.CheckpointTrainEntrypoint`.

    A single process validates the input, takes the lock and resolves the
    restart before torch and deepmd-kit's training code are imported, so a
    mistake is reported within a second.
    """
    import os

    prepared = None
    if os.environ.get("LOCAL_RANK") is None:
        from ..ranks import SingleProcess
        from .prepare import prepare_run

        prepared = prepare_run(
            flags.INPUT,
            restart=flags.restart,
            init_model=flags.init_model,
            pm=plugin_manager(),
            ranks=SingleProcess(),
        )
    from deepmd.dpmodel.train.entrypoint import TrainEntrypointOptions

    from .pt_expt.train import CheckpointTrainEntrypoint

    CheckpointTrainEntrypoint(prepared).run(
        TrainEntrypointOptions(
            input_file=flags.INPUT,
            output=flags.output,
            init_model=flags.init_model,
            restart=flags.restart,
            finetune=flags.finetune,
            model_branch=flags.model_branch,
            use_pretrain_script=flags.use_pretrain_script,
            skip_neighbor_stat=flags.skip_neighbor_stat,
        )
    )


#: The host's own built-in plugins: name to module.
HOST_PLUGINS = {"freeze": "dp_ckpt_plugin.deepmd.pt_expt.freeze"}


def plugin_manager():
    """The plugin manager of a ``dp`` command: the core's plugins and the host's."""
    from ..plugins import get_plugin_manager

    return get_plugin_manager(host_plugins=HOST_PLUGINS)


def share_deepmd_handlers(logger: logging.Logger) -> None:
    """Send this package's log records where deepmd-kit sends its own."""
    source = logging.getLogger("deepmd")
    logger.handlers = list(source.handlers)
    logger.setLevel(source.level)
    logger.propagate = False
