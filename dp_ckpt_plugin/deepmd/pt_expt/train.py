"""deepmd-kit's pt_expt training pipeline, with checkpoints through the store.

Each step of deepmd-kit's ``PTExptTrainEntrypoint`` that concerns checkpoints is
overridden; the rest is inherited:

``prepare_options``
    Runs before deepmd-kit reads anything. Under ``torchrun`` it starts the
    process group (gloo without a GPU). Unless :func:`dp_ckpt_plugin.deepmd.prepare.prepare_run` ran
    already (a single process does it before importing torch), it validates the
    input, opens and locks the store and resolves ``--restart``,
    ``--init-model`` and ``--finetune``. The resolved paths are handed on as
    they are: ``latest`` is never turned into ``latest.pt``; deepmd-kit's
    ``torch.load`` of them reads the bytes the preflight verified
    (:mod:`..loading`).
``load_config``
    Hands deepmd-kit a ``save_dir`` on object storage as its local staging
    directory (:func:`~..settings.for_deepmd`).
``setup_run`` / ``teardown_run``
    Keep the process group made above; close the store at the end.
``run_training``
    Seeds ``dp_random``, the one generator deepmd-kit leaves to chance, from
    ``training.seed`` (:func:`~..exact.seed_rngs`), then builds the trainer
    from :func:`.trainer.make_trainer_class`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deepmd.pt_expt.entrypoints.main import PTExptTrainEntrypoint
from deepmd.pt_expt.train import training

from ...ranks import current_ranks
from ..checkpointing import HostRun
from ..exact import seed_rngs
from ..prepare import prepare_training
from ..runtime import start_process_group, swapped
from ..settings import for_deepmd
from . import DESCRIPTOR
from .trainer import make_trainer_class

#: This host's name, as :mod:`dp_ckpt_plugin.deepmd.takeover` registers it.
HOST = DESCRIPTOR.name


def train(flags, prepared: HostRun | None) -> None:
    """``dp --pt-expt train``: deepmd-kit's pipeline with the steps below.

    ``prepared`` is the preflight of a single process (``None`` under
    ``torchrun``, where it runs once the process group is up).
    """
    from deepmd.dpmodel.train.entrypoint import TrainEntrypointOptions

    entrypoint = CheckpointTrainEntrypoint(prepared)
    try:
        entrypoint.run(
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
    finally:
        if entrypoint.prepared is not None:
            entrypoint.prepared.close()


class CheckpointTrainEntrypoint(PTExptTrainEntrypoint):
    """``dp --pt-expt train`` with dp_ckpt_plugin's store, resolution and lock.

    Parameters
    ----------
    prepared : HostRun, optional
        The outcome of :func:`dp_ckpt_plugin.deepmd.prepare.prepare_run` if it ran already.
    """

    def __init__(self, prepared: HostRun | None = None) -> None:
        super().__init__()
        self.prepared = prepared
        self._made_group = False

    def prepare_options(self, options):
        self._made_group = start_process_group()
        if self.prepared is None:
            self.prepared = prepare_training(
                HOST, options.input_file, options, current_ranks()
            )
        # deepmd-kit loads the verified bytes, not the files again
        self.prepared.payloads.start()
        return replace(
            options,
            restart=self.prepared.restart,
            init_model=self.prepared.init_model,
            finetune=self.prepared.finetune,
        )

    def load_config(self, input_file: str) -> dict[str, Any]:
        # validated already by the preflight
        return for_deepmd(super().load_config(input_file), self.prepared.settings)

    def setup_run(self, options, config) -> None:
        super().setup_run(options, config)
        self._owns_process_group = self._owns_process_group or self._made_group

    def run_training(self, config, options, neighbor_stat) -> None:
        run = self.prepared
        run.training = config["training"]  # normalized: deepmd-kit's defaults
        seed_rngs(config["training"].get("seed"), current_ranks().rank)
        with swapped(training, "Trainer", make_trainer_class(run)):
            super().run_training(config, options, neighbor_stat)
        if run.store is not None:
            run.store.wait()  # the last background save, before anything ends

    def teardown_run(self, options, config) -> None:
        try:
            super().teardown_run(options, config)
        finally:
            if self.prepared is not None:
                self.prepared.close()
