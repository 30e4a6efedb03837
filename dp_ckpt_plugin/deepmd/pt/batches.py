"""``dp --pt``'s batches, drawn so that where they are can be saved and restored.

deepmd-kit 3.2's ``dp --pt`` draws a training batch in two stages:

1. an outer ``torch.utils.data.DataLoader`` over a ``DpLoaderSet`` samples a
   system index with a ``WeightedRandomSampler`` (a fresh draw from torch's
   global generator at the start of each pass), in ``NUM_WORKERS`` worker
   processes;
2. ``DpLoaderSet[i]`` takes the next batch of system ``i`` from an inner
   ``DataLoader`` (a ``RandomSampler``, seeded from torch's global generator
   at the start of each of its passes, or a ``DistributedSampler`` under
   several ranks).

The iterators of both live in generators, and with workers in other
processes: nothing of them can be saved. With exact resume, the outer loader
is replaced by :class:`ResumableLoader` and each inner iterator by
:class:`SystemBatches`. They draw the same way (a seed from torch's global
generator at the start of each pass, the same samplers), in the training
process, and keep their place as two integers: the seed of the current pass
and how far into it they are. Restoring regenerates the pass from its seed
(one ``multinomial`` or ``randperm`` call) and moves to the position, at the
same cost at any step.

The batches differ from those of deepmd-kit with worker processes (each
worker there holds its own copy of the per-system iterators), not in kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def draw_seed() -> int:
    """A seed from torch's global generator, as ``RandomSampler`` draws one."""
    import torch

    return int(torch.empty((), dtype=torch.int64).random_().item())


def _generator(seed: int):
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


class _Pass:
    """A position in passes over an order drawn from a seed.

    Subclasses say how a seed becomes an order (:meth:`order_for`).
    """

    def __init__(self) -> None:
        self.seed: int | None = None
        self.position = 0
        self.order: list | None = None
        self._pending: tuple[int | None, int] | None = None

    def order_for(self, seed: int | None) -> list:
        raise NotImplementedError

    def draws_seed(self) -> bool:
        return True

    def new_pass(self) -> None:
        if self._pending is not None and (
            self._pending[0] is not None or not self.draws_seed()
        ):
            seed, position = self._pending
            self._pending = None
        else:  # a fresh pass (also in place of one that had not started)
            self._pending = None
            seed, position = (draw_seed() if self.draws_seed() else None), 0
        self.seed, self.position = seed, position
        self.order = self.order_for(seed)

    def take(self):
        """The next entry of this pass, or ``None`` at its end."""
        if self._pending is not None:
            self.new_pass()
        if self.order is None or self.position >= len(self.order):
            return None
        item = self.order[self.position]
        self.position += 1
        return item

    def state(self) -> dict[str, Any]:
        return {"seed": self.seed, "position": int(self.position)}

    def restore(self, state: dict[str, Any]) -> None:
        seed = state["seed"]
        self._pending = (None if seed is None else int(seed), int(state["position"]))
        self.order = None


class SystemBatches(_Pass):
    """The batches of one system, cycling over passes (replaces an inner iterator).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        deepmd-kit's loader of the system: its dataset, batch size, sampler
        and collate function are used as they are.
    """

    def __init__(self, loader) -> None:
        super().__init__()
        self.loader = loader

    def draws_seed(self) -> bool:
        from torch.utils.data import RandomSampler

        return isinstance(self.loader.sampler, RandomSampler)

    def order_for(self, seed: int | None) -> list:
        import torch

        sampler = self.loader.sampler
        if seed is not None:
            frames = torch.randperm(len(sampler), generator=_generator(seed)).tolist()
        else:  # a DistributedSampler (its own fixed seed) or sequential
            frames = list(iter(sampler))
        size = int(self.loader.batch_size)
        batches = [frames[i : i + size] for i in range(0, len(frames), size)]
        if self.loader.drop_last and batches and len(batches[-1]) < size:
            batches.pop()
        return batches

    def __iter__(self):
        return self

    def __next__(self):
        indices = self.take()
        if indices is None:
            self.new_pass()
            indices = self.take()
        dataset = self.loader.dataset
        return self.loader.collate_fn([dataset[i] for i in indices])


class ResumableLoader(_Pass):
    """deepmd-kit's outer loader over a ``DpLoaderSet``, in the training process.

    Takes the arguments deepmd-kit gives ``DataLoader``; the sampler is a
    ``WeightedRandomSampler``. Worker, pinning and batching arguments are
    ignored: each item is already a batch of one system.
    """

    def __init__(
        self,
        dataset,
        sampler=None,
        *,
        collate_fn: Callable | None = None,
        **ignored: Any,
    ) -> None:
        super().__init__()
        self.dataset = dataset
        self.sampler = sampler
        self.collate_fn = collate_fn or (lambda batch: batch)
        self.systems = [SystemBatches(loader) for loader in dataset.dataloaders]
        dataset.iters = self.systems

    def order_for(self, seed: int | None) -> list:
        import torch

        sampler = self.sampler
        return torch.multinomial(
            sampler.weights,
            sampler.num_samples,
            sampler.replacement,
            generator=_generator(seed),
        ).tolist()

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        self.new_pass()
        while True:
            index = self.take()
            if index is None:
                return
            yield self.collate_fn(self.dataset[index])

    def state(self) -> dict[str, Any]:
        return {**super().state(), "systems": [s.state() for s in self.systems]}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        for system, saved in zip(self.systems, state["systems"], strict=True):
            system.restore(saved)


def resumable(dataset, sampler) -> bool:
    """Whether deepmd-kit's loader of ``dataset`` can be a :class:`ResumableLoader`."""
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from torch.utils.data import WeightedRandomSampler

    return isinstance(dataset, DpLoaderSet) and isinstance(
        sampler, WeightedRandomSampler
    )


def loaders_of(trainer) -> list[Any] | None:
    """Every data loader of a ``dp --pt`` trainer, in a fixed order.

    ``None`` if one of them is not a :class:`ResumableLoader` (LMDB data).
    """
    found = []
    for name in ("training_dataloader", "validation_dataloader"):
        value = getattr(trainer, name, None)
        if isinstance(value, dict):
            found.extend(value.get(key) for key in trainer.model_keys)
        else:
            found.append(value)
    if any(x is not None and not isinstance(x, ResumableLoader) for x in found):
        return None
    return found


def capture(loaders: list[Any]) -> list[dict[str, Any] | None]:
    """The position of each loader (``None`` where there is none)."""
    return [None if x is None else x.state() for x in loaders]


def restore(loaders: list[Any], states: list[Any]) -> str | None:
    """Put each loader where :func:`capture` found it; return why not, or ``None``."""
    if len(states) != len(loaders):
        return "the data loaders differ from the checkpoint's"
    for loader, state in zip(loaders, states, strict=True):
        if (loader is None) != (state is None) or (
            loader is not None and len(loader.systems) != len(state["systems"])
        ):
            return "the data systems differ from the checkpoint's"
    for loader, state in zip(loaders, states, strict=True):
        if loader is not None:
            loader.restore(state)
    return None
