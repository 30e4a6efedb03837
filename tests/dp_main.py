"""deepmd-kit's ``dp`` in this process, with what a test needs around it.

Run as ``python dp_main.py --pt train input.json``: with ``DP_CKPT_DISABLE=1``
it is plain deepmd-kit, the baseline of an identity test. Three environment
variables set what ``dp`` cannot by itself:

``PLAIN_CPU_RANKS=1``
    under ``torchrun`` without a GPU: deepmd-kit 3.2 asks for NCCL and a CUDA
    device per rank; torch's gloo process group is started first, and the
    three calls that need a GPU pass (deepmd-kit's own start of the group,
    ``torch.cuda.set_device`` and DDP's device ids).
``PLAIN_DP_RANDOM_SEED=S``
    ``dp --pt-expt`` makes ``dp_random`` from the operating system's entropy
    (its runs differ from each other); it is seeded with ``S`` on rank 0 and
    ``[S, rank]`` elsewhere, as the plugin seeds it from ``training.seed``.

``DEFAULT_DEVICE=cuda:9999999``
    ``torch.set_default_device`` first, as deepmd-kit's own ``pt`` tests do,
    so that any tensor made without naming its device fails.

Every number is deepmd-kit's.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("PLAIN_CPU_RANKS") == "1":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.init_process_group = lambda *args, **kwargs: None
    torch.cuda.set_device = lambda device: None

    from deepmd.pt.train import training

    _ddp = training.DDP

    def _ddp_on_cpu(module, *args, device_ids=None, output_device=None, **kwargs):
        return _ddp(module, *args, **kwargs)

    training.DDP = _ddp_on_cpu

if os.environ.get("PLAIN_DP_RANDOM_SEED"):
    from deepmd.utils import random as dp_random

    seed = int(os.environ["PLAIN_DP_RANDOM_SEED"])
    rank = int(os.environ.get("RANK", "0"))
    dp_random.seed(seed if rank == 0 else [seed % 2**32, rank])

if os.environ.get("DEFAULT_DEVICE"):
    import torch

    torch.set_default_device(os.environ["DEFAULT_DEVICE"])

from deepmd.main import main

if __name__ == "__main__":
    main(sys.argv[1:])
