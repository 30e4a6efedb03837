"""Rule 9 with a real two-process torch.distributed (gloo) group."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import free_port, needs_torch

HOLDER = ".dp_ckpt.holder.json"

pytestmark = needs_torch


def worker(rank: int, world: int, port: int, directory: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from dp_ckpt_plugin import CheckpointManager

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    touched = []
    if rank != 0:
        # any filesystem write from a non-chief rank is recorded
        real_replace, real_open = os.replace, os.open

        def replace(src, dst):
            touched.append(str(dst))
            return real_replace(src, dst)

        def os_open(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                touched.append(str(path))
            return real_open(path, flags, *args, **kwargs)

        os.replace, os.open = replace, os_open
    m = CheckpointManager(directory, format="torch", max_keep=2)
    paths = [
        str(m.save(step, {"w": torch.full((3,), float(step))})) for step in (1, 2, 3)
    ]
    dist.barrier()
    restored = m.restore("latest")
    result = {
        "paths": paths,
        "latest": str(restored.path),
        "w": restored.state["w"].tolist(),
        "touched": touched,
        "pid": os.getpid(),
        # the lock's holder note while the store is open (closing removes it)
        "holder": json.loads((Path(directory) / HOLDER).read_text())
        if rank == 0
        else None,
    }
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(result, fh)
    m.close()
    dist.destroy_process_group()


def test_two_ranks_only_chief_writes_and_both_resolve_the_same(tmp_path):
    import torch.multiprocessing as mp

    directory = tmp_path / "models"
    out = str(tmp_path / "result")
    mp.spawn(worker, args=(2, free_port(), str(directory), out), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1))
    assert (
        r0["paths"]
        == r1["paths"]
        == [str(directory / f"model.ckpt-{s}.pt") for s in (1, 2, 3)]
    )
    assert r0["latest"] == r1["latest"] == str(directory / "model.ckpt-3.pt")
    assert r0["w"] == r1["w"] == [3.0, 3.0, 3.0]
    assert r1["touched"] == []
    assert r0["holder"]["pid"] == r0["pid"]
    assert not (directory / HOLDER).exists(), "closing leaves the holder note"
    assert sorted(p.name for p in directory.glob("model.ckpt-*.pt")) == [
        "model.ckpt-2.pt",
        "model.ckpt-3.pt",
    ]
