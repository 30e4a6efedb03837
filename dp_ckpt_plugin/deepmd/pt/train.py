"""deepmd-kit's ``dp --pt train``, with checkpoints through the store.

deepmd-kit 3.2's PyTorch ``train`` is one function, not a pipeline of
overridable steps as pt_expt's is; it is called as it is, with:

- the handles the preflight resolved (:func:`~..prepare.prepare_run`):
  resolved paths end in ``.pt``, so ``latest`` never becomes ``latest.pt``;
  deepmd-kit's ``torch.load`` of them reads the bytes the preflight verified
  (:mod:`..loading`);
- ``training.Trainer`` replaced by :func:`.trainer.make_trainer_class`;
- its ``j_loader`` handing deepmd-kit a ``save_dir`` on object storage as its
  local staging directory (:func:`~..settings.for_deepmd`);
- under ``torchrun``, the process group started first (gloo without a GPU)
  and deepmd-kit's own ``init_process_group`` keeping it
  (:class:`~..runtime.GroupAlreadyUp`);
- ``training.DataLoader`` replaced (:func:`data_loader`): with
  ``exact_resume``, by :class:`~.batches.ResumableLoader`, which draws
  deepmd-kit's batches bit for bit and whose position goes into each
  checkpoint; otherwise by one whose workers ignore the stop signals
  (:func:`~..preempt.ignore_in_worker`): a signal to the process group (a
  terminal's Ctrl-C, ``kill -TERM -<pgid>``, Slurm, ``torchrun``) would
  otherwise kill them and, with them, the trainer in mid-save.

No generator is seeded beyond what deepmd-kit seeds: a run gives the rows and
tensors of plain deepmd-kit's.
"""

from __future__ import annotations

import functools
import signal

from deepmd.pt.entrypoints import main as pt_main
from deepmd.pt.train import training

from ...ranks import current_ranks
from ..checkpointing import HostRun
from ..preempt import ignore_in_worker
from ..prepare import prepare_training
from ..runtime import GroupAlreadyUp, start_process_group, swapped
from ..settings import for_deepmd
from . import DESCRIPTOR
from .batches import ResumableLoader, resumable
from .trainer import make_trainer_class

#: This host's name, as :mod:`dp_ckpt_plugin.deepmd.takeover` registers it.
HOST = DESCRIPTOR.name


def train(flags, run: HostRun | None) -> None:
    """``dp --pt train``; ``run`` (the preflight's) is ``None`` under ``torchrun``."""
    if run is None:
        start_process_group()
        run = prepare_training(HOST, flags.INPUT, flags, current_ranks())
    try:
        run.payloads.start()
        settings = run.settings
        loader = pt_main.j_loader
        with (
            swapped(training, "Trainer", make_trainer_class(run)),
            swapped(
                pt_main, "j_loader", lambda path: for_deepmd(loader(path), settings)
            ),
            swapped(pt_main, "dist", GroupAlreadyUp(pt_main.dist)),
            swapped(
                training,
                "DataLoader",
                data_loader(training.DataLoader, settings.options),
            ),
        ):
            pt_main.train(
                input_file=flags.INPUT,
                init_model=run.init_model,
                restart=run.restart,
                finetune=run.finetune,
                init_frz_model=flags.init_frz_model,
                model_branch=flags.model_branch,
                skip_neighbor_stat=flags.skip_neighbor_stat,
                use_pretrain_script=flags.use_pretrain_script,
                force_load=flags.force_load,
                output=flags.output,
            )
        if run.store is not None:
            run.store.wait()  # the last background save, before anything ends
    finally:
        run.close()


def data_loader(loader: type, options) -> type:
    """The class deepmd-kit's trainer builds its data loaders with.

    Its workers ignore the stop signals. With ``exact_resume``, a loader over
    deepmd-kit's ``DpLoaderSet`` is a :class:`~.batches.ResumableLoader` (its
    position is saved with each checkpoint); any other (LMDB data) is
    deepmd-kit's.
    """
    signums = tuple(signal.Signals[name] for name in options.stop_signals)

    class CheckpointingDataLoader(loader):
        def __new__(cls, dataset=None, *args, sampler=None, **kwargs):
            exact = options.exact_resume and not args
            if exact and resumable(dataset, sampler, kwargs):
                return ResumableLoader(dataset, sampler, **kwargs)
            return super().__new__(cls)

        def __init__(self, *args, worker_init_fn=None, **kwargs) -> None:
            if signums:
                worker_init_fn = functools.partial(
                    ignore_in_worker, signums, then=worker_init_fn
                )
            super().__init__(*args, worker_init_fn=worker_init_fn, **kwargs)

    return CheckpointingDataLoader
