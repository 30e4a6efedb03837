"""A small NumPy training loop that checkpoints with the HDF5 backend.

It fits a linear model by gradient descent, saves a checkpoint every
``--save-freq`` steps through :class:`dp_ckpt_plugin.CheckpointManager`, and
resumes from any restart specification (``latest``, a directory, a file)::

    python examples/numpy_train.py --save-dir models --steps 200
    python examples/numpy_train.py --save-dir models --steps 400 --restart latest

``--kill-at STEP`` sends the process SIGKILL right after that step, to show
that a killed run resumes from its last committed checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import numpy as np

from dp_ckpt_plugin import CheckpointError, CheckpointManager


def make_problem(seed: int = 0, n: int = 256, dim: int = 8):
    """Return inputs and targets of a noisy linear regression problem."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    w_true = rng.standard_normal(dim)
    return x, x @ w_true + 0.01 * rng.standard_normal(n)


def loss_and_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Mean squared error and its gradient."""
    residual = x @ w - y
    return float(residual @ residual / len(y)), 2.0 * x.T @ residual / len(y)


def train(args: argparse.Namespace) -> int:
    """Run (or resume) the training loop; return the exit code."""
    x, y = make_problem()
    manager = CheckpointManager(args.save_dir, format="hdf5", max_keep=args.max_keep)
    step, w, lr = 0, np.zeros(x.shape[1]), args.lr
    if args.restart:
        restored = manager.restore(args.restart)
        step = int(restored.state["step"])
        w = restored.state["w"]
        lr = float(restored.state["lr"])
        print(f"resumed from {restored.path} at step {step}")
    while step < args.steps:
        step += 1
        loss, grad = loss_and_grad(w, x, y)
        w = w - lr * grad
        if step % args.save_freq == 0 or step == args.steps:
            path = manager.save(step, {"w": w, "step": step, "lr": lr, "loss": loss})
            print(f"step {step:5d}  loss {loss:.6f}  saved {path}")
        if args.kill_at is not None and step == args.kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    manager.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and train; user errors end with a message, not a traceback."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-dir", default="models")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-freq", type=int, default=20)
    parser.add_argument("--max-keep", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--restart", help="latest, a checkpoint directory, file or prefix"
    )
    parser.add_argument(
        "--kill-at", type=int, help="SIGKILL the process after this step"
    )
    args = parser.parse_args(argv)
    try:
        return train(args)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
