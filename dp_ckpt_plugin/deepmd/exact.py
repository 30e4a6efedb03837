"""Exact resume: what a continuation needs besides the weights, kept in the checkpoint.

deepmd-kit's payload holds the model, the optimizer and the EMA state. A run
continued from it draws its batches afresh: the random generators start from
wherever the new process left them, and the data iteration starts over. This
module keeps the rest, under one more key of the payload, :data:`KEY`, which
deepmd-kit's readers ignore (they read ``model``, ``optimizer`` and the EMA
key by name)::

    payload["_dp_ckpt"] = {
        "format": 1,
        "step": 20,                 # steps done
        "world_size": 2,
        "ranks": [                  # one entry per rank, in rank order
            {"rng": {...}, "data": [...]},
            ...
        ],
    }

``rng`` is every random generator a training step draws from (Python's
``random``, NumPy's global generator, deepmd-kit's ``dp_random`` that picks
systems and shuffles frames, torch's CPU generator and, when CUDA is in use,
its per-device generators): :func:`capture_rngs`, :func:`restore_rngs`.
``data`` is the position of the data iteration, in the host's terms (each
host folder knows its data pipeline): a few integers per data system and
the order of the frames of its current pass, never the batches consumed, so
that restoring it costs the same at step 10 and at step 10 million.

Everything is a tensor, an int, a float, a str, a list or a dict:
``torch.load(weights_only=True)`` (deepmd-kit's reader) loads it. With
``training._dp_ckpt.exact_resume`` off, the key holds the step only.

:class:`ExactResume` is what a trainer holds: it builds the key at each save
and, at ``--restart``, reads it back, gives each rank its own state and says
in one log line whether the continuation is exact and, if not, why.

Importing this module imports neither torch nor deepmd-kit.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

log = logging.getLogger("dp_ckpt_plugin")

#: The payload key of the plugin's state (deepmd-kit reads other keys by name).
KEY = "_dp_ckpt"
#: The layout of :data:`KEY`'s value.
FORMAT = 1
#: Why a run reading LMDB data has no exact resume.
LMDB = "the run reads LMDB data, whose position is not captured"


# -- random generators -------------------------------------------------------------


def capture_rngs() -> dict[str, Any]:
    """The state of every random generator a training step may draw from."""
    import numpy as np
    import torch
    from deepmd.utils import random as dp_random

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": _numpy_state(np.random.get_state()),
        "dp_random": _numpy_state(dp_random._RANDOM_GENERATOR.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rngs(state: dict[str, Any]) -> None:
    """Set every random generator to what :func:`capture_rngs` recorded."""
    import numpy as np
    import torch
    from deepmd.utils import random as dp_random

    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    np.random.set_state(_numpy_tuple(state["numpy"]))
    dp_random._RANDOM_GENERATOR.set_state(_numpy_tuple(state["dp_random"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def seed_rngs(seed: int | None, rank: int = 0) -> None:
    """Seed the one generator deepmd-kit's ``dp --pt-expt`` leaves to chance.

    deepmd-kit 3.2's ``dp --pt-expt`` hands ``training.seed`` to LMDB data
    only: ``dp_random``, which picks the system of each batch and shuffles the
    frames of a system, is made from the operating system's entropy, so two
    runs of the same input differ from the first step. It is seeded with
    ``seed`` on rank 0 and ``[seed, rank]`` elsewhere (ranks draw different
    batches, as they do without a seed). No other generator is touched: where
    plain deepmd-kit repeats itself, the plugin's run is its run. ``None``
    seeds nothing.
    """
    if seed is None:
        return
    from deepmd.utils import random as dp_random

    seed = int(seed)
    dp_random.seed(seed if rank == 0 else [seed % 2**32, rank])


def _numpy_state(state: tuple) -> dict[str, Any]:
    import torch

    name, keys, pos, has_gauss, cached = state
    return {
        "kind": str(name),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _numpy_tuple(state: dict[str, Any]) -> tuple:
    import numpy as np

    keys = state["keys"].cpu().numpy().astype(np.uint32)
    return (
        state["kind"],
        keys,
        int(state["pos"]),
        int(state["has_gauss"]),
        float(state["cached_gaussian"]),
    )


# -- the run's side ----------------------------------------------------------------


@dataclass
class Continuation:
    """What a restart found in its checkpoint.

    Attributes
    ----------
    state : dict or None
        This rank's state (``rng`` and ``data``); ``None`` when the
        continuation is not exact.
    reason : str or None
        Why it is not exact (``None`` when it is).
    """

    state: dict[str, Any] | None
    reason: str | None = None

    @property
    def exact(self) -> bool:
        return self.state is not None


@dataclass
class ExactResume:
    """A trainer's side of exact resume.

    Parameters
    ----------
    enabled : bool
        ``training._dp_ckpt.exact_resume``.
    rank, world_size : int
        This process in the run.
    unsupported : str or None
        Why this run's data pipeline cannot be captured (then nothing is
        captured and a restart says so).
    changed : str or None
        Why the checkpoint's data position does not fit this run's data
        (its systems changed): a restart then restores nothing.
    """

    enabled: bool = True
    rank: int = 0
    world_size: int = 1
    unsupported: str | None = None
    changed: str | None = None

    @property
    def active(self) -> bool:
        """Whether checkpoints carry the state."""
        return self.enabled and self.unsupported is None

    def payload_entry(
        self,
        step: int,
        local: Callable[[], dict[str, Any]] | None,
        gather: Callable[[dict[str, Any]], Sequence[dict[str, Any]]] | None = None,
    ) -> dict[str, Any]:
        """The value of :data:`KEY` for a checkpoint of ``step`` steps done.

        ``local`` captures this rank's state; ``gather`` (every rank calls
        it, collectively) returns every rank's, in rank order. Without
        ``gather`` the chief's state stands for every rank (a host whose
        ranks draw the same random numbers by construction). Without
        ``local`` (a save the chief makes alone, whose ranks' states cannot
        be gathered) the entry holds the step only.
        """
        entry: dict[str, Any] = {"format": FORMAT, "step": int(step)}
        if not self.active or local is None:
            return entry
        mine = local()
        ranks = list(gather(mine)) if gather is not None else [mine]
        return {**entry, "world_size": self.world_size, "ranks": ranks}

    def continuation(self, entry: Any) -> Continuation:
        """This rank's state from a checkpoint's :data:`KEY` value, or why not."""
        off = None if self.enabled else "training._dp_ckpt.exact_resume is off"
        if (why := off or self.unsupported or self.changed) is not None:
            return Continuation(None, why)
        if not isinstance(entry, dict):
            return Continuation(
                None,
                "the checkpoint was written by plain deepmd-kit "
                "(it holds no random or data state)",
            )
        ranks = entry.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            return Continuation(
                None,
                "the checkpoint was written with training._dp_ckpt.exact_resume off",
            )
        written = int(entry.get("world_size", len(ranks)))
        if written != self.world_size:
            return Continuation(
                None,
                f"the checkpoint was written by {written} rank(s), this run has "
                f"{self.world_size}",
            )
        return Continuation(ranks[self.rank] if len(ranks) > 1 else ranks[0])


def all_ranks(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state``, in rank order (called by every rank, collectively)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def read_entry(file: BinaryIO) -> Any:
    """The :data:`KEY` value of a checkpoint (``None`` if absent).

    ``file`` holds the checkpoint's bytes, the ones the front door verified
    and deepmd-kit's trainer loaded (:class:`~.loading.ServedPayloads`).
    """
    import torch

    payload = torch.load(file, map_location="cpu", weights_only=True)
    return payload.get(KEY) if isinstance(payload, dict) else None


def on_cpu(value: Any) -> Any:
    """``value`` with every tensor in it on the CPU (as :func:`read_entry` loads it).

    deepmd-kit's trainer loads its checkpoint onto its device; the plugin's
    entry, kept from that load, is moved back.
    """
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(on_cpu(v) for v in value)
    cpu = getattr(value, "cpu", None)
    return cpu() if callable(cpu) else value


def restart_line(step: int | None, found: Continuation, changes=None) -> str:
    """The one log line of a restart: exact or not, and why not.

    ``changes`` (:class:`~.origin.Changes`): what changed since the
    checkpoint; the first is named here, the others have a line each.
    """
    at = f" at step {step}" if step is not None else ""
    lines = list(changes.lines) if changes is not None else []
    if lines and found.exact:
        more = f" (and {len(lines) - 1} more, above)" if len(lines) > 1 else ""
        return (
            f"resume{at} is not exact: {lines[0]}{more}; the batches and random "
            "generators are restored, but the run from here on is not the "
            "uninterrupted run of this input"
        )
    if found.exact:
        return (
            f"exact resume{at}: random generators and data position restored; "
            "the run continues as if it had not stopped"
        )
    changed = f" ({len(lines)} changes of the input, above)" if lines else ""
    return (
        f"resume{at} is not exact: {found.reason}; the batches from here on "
        f"differ from those of an uninterrupted run{changed}"
    )
