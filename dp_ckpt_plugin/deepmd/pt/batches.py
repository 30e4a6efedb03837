"""``dp --pt``'s batches, drawn exactly as deepmd-kit 3.2 draws them, with a position.

deepmd-kit 3.2's ``dp --pt`` draws a training batch in two stages, read from
its ``pt/utils/dataloader.py`` and ``pt/train/training.py`` and from torch's
``utils/data`` as installed:

1. an outer ``DataLoader`` over a ``DpLoaderSet``, cycled for ever: each
   pass (``iter()``) draws a base seed from torch's global generator, then
   its ``WeightedRandomSampler`` draws the pass's system indices with one
   ``multinomial`` call on the same generator;
2. ``DpLoaderSet[i]`` takes the next batch of system ``i`` from an inner
   ``DataLoader`` iterator: its ``RandomSampler`` draws a seed at the first
   batch of each pass (a ``DistributedSampler`` under several ranks draws
   none), and a pass that ends is replaced by a new iterator, whose
   construction draws a base seed first.

With ``NUM_WORKERS`` = 0 every draw is on the training process's generator.
With W > 0 workers, each pass forks W processes; worker ``w`` seeds its
generator with the pass's base seed + ``w``, starts from the inner
iterators as the training process built them (not yet started), and makes
every ``k``-th batch of the pass with ``k % W == w``, in that order.

:class:`ResumableLoader` makes the same draws in the training process (a
private ``torch.Generator`` stands for each worker's), so the batches are
deepmd-kit's bit for bit, and keeps their place at a constant size: the
generator's state before the pass's ``multinomial`` (the pass is drawn again
from it), the position in the pass, each worker's generator, and per system
(per worker) whether its pass started, its seed and its position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Tensors the plugin makes are on the CPU, whatever the process's default device.
CPU = "cpu"
#: The kind of drawing a saved position belongs to (other kinds are refused).
KIND = "deepmd-3.2"


def draw_int64(generator=None) -> int:
    """One 64-bit draw, as torch's samplers and loader iterators make it."""
    import torch

    value = torch.empty((), dtype=torch.int64, device=CPU)
    return int(value.random_(generator=generator).item())


def _generator(seed: int | None = None, state=None):
    import torch

    generator = torch.Generator(device=CPU)
    if state is not None:
        generator.set_state(state)
    elif seed is not None:
        generator.manual_seed(seed)
    return generator


class SystemBatches:
    """One system's batches, as deepmd-kit's inner iterator (and its successors) yields them.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        deepmd-kit's loader of the system: its dataset, batch size, sampler
        and collate function are used as they are.
    """

    def __init__(self, loader) -> None:
        self.loader = loader
        self.started = False
        self.seed: int | None = None
        self.position = 0
        self._order: list[list[int]] | None = None

    def _draws_seed(self) -> bool:
        from torch.utils.data import RandomSampler

        sampler = self.loader.sampler
        return isinstance(sampler, RandomSampler) and sampler.generator is None

    def _batches(self) -> list[list[int]]:
        if self._order is None:
            import torch

            sampler = self.loader.sampler
            if self.seed is not None:
                frames = torch.randperm(
                    len(sampler), generator=_generator(self.seed), device=CPU
                ).tolist()
            else:  # a DistributedSampler (its own fixed seed) or sequential
                frames = list(iter(sampler))
            size = int(self.loader.batch_size)
            batches = [frames[i : i + size] for i in range(0, len(frames), size)]
            if self.loader.drop_last and batches and len(batches[-1]) < size:
                batches.pop()
            self._order = batches
        return self._order

    def _begin(self, generator) -> None:
        self.started, self.position, self._order = True, 0, None
        self.seed = draw_int64(generator) if self._draws_seed() else None

    def next_batch(self, generator=None):
        """The next batch; seeds are drawn from ``generator`` (``None``: torch's global)."""
        if not self.started:
            self._begin(generator)
        elif self.position >= len(self._batches()):
            draw_int64(generator)  # the new iterator's base seed
            self._begin(generator)
        indices = self._batches()[self.position]
        self.position += 1
        dataset = self.loader.dataset
        return self.loader.collate_fn([dataset[i] for i in indices])

    def state(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "seed": self.seed,
            "position": int(self.position),
        }

    def restore(self, state: dict[str, Any]) -> None:
        seed = state["seed"]
        self.started = bool(state["started"])
        self.seed = None if seed is None else int(seed)
        self.position = int(state["position"])
        self._order = None


class ResumableLoader:
    """deepmd-kit's outer loader over a ``DpLoaderSet``, drawn in the training process.

    Takes the arguments deepmd-kit gives ``DataLoader`` (the sampler is a
    ``WeightedRandomSampler``, ``batch_size=None``).
    """

    def __init__(
        self,
        dataset,
        sampler=None,
        *,
        num_workers: int = 0,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        **ignored: Any,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.num_workers = int(num_workers)
        self.collate_fn = collate_fn or (lambda batch: batch)
        self.pin_memory = bool(pin_memory)
        # one set of system iterators in the process, or one per worker
        self.systems = [self._fresh_systems() for _ in range(self.lanes)]
        self.generators: list[Any] = []
        self.pass_state = None  # torch's generator before the pass's multinomial
        self.position = 0
        self._order: list[int] | None = None
        self._resume = False

    @property
    def lanes(self) -> int:
        """How many sets of system iterators draw: the workers, or the process."""
        return max(self.num_workers, 1)

    def _fresh_systems(self) -> list[SystemBatches]:
        return [SystemBatches(loader) for loader in self.dataset.dataloaders]

    def _draw_order(self, generator=None) -> list[int]:
        """The pass's system indices, one ``multinomial`` as torch's sampler draws them."""
        import torch

        sampler = self.sampler
        return torch.multinomial(
            sampler.weights,
            sampler.num_samples,
            sampler.replacement,
            generator=generator,
        ).tolist()

    def _new_pass(self) -> None:
        import torch

        self._say_as_torch()
        base_seed = draw_int64()  # the iterator's base seed
        self.pass_state = torch.get_rng_state()
        self._order = self._draw_order()  # on torch's global generator
        self.position = 0
        if self.num_workers:
            self.generators = [
                _generator(base_seed + worker) for worker in range(self.num_workers)
            ]
            self.systems = [self._fresh_systems() for _ in range(self.num_workers)]

    def _say_as_torch(self) -> None:
        """The warnings torch's loader gives at each ``iter()``, from torch itself.

        A ``DataLoader`` with the same worker and pinning settings over no
        data says them (``pin_memory`` without an accelerator, more workers
        than CPUs) at torch's own lines, so that a user's log shows what
        plain deepmd-kit's shows; its base seed comes from a generator of
        its own, not torch's global one.
        """
        from torch.utils.data import DataLoader

        def shadow(workers: int):
            return DataLoader(
                [],
                batch_size=None,
                num_workers=workers,
                pin_memory=self.pin_memory,
                generator=_generator(0),
            )

        if self.num_workers:
            shadow(self.num_workers).check_worker_number_rationality()
        if self.pin_memory:
            iter(shadow(0))  # the iterator's warning, no process started

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        """A pass: set up at ``iter()``, as torch's iterator draws its base seed."""
        import torch

        with torch.device(CPU):  # whatever default device the process has
            if self._resume:
                self._resume = False
            else:
                self._new_pass()
        return self._pass()

    def _pass(self):
        import torch

        order = self._order or []
        while self.position < len(order):
            k = self.position
            self.position += 1
            lane = k % self.num_workers if self.num_workers else 0
            generator = self.generators[lane] if self.num_workers else None
            index = order[k]
            with torch.device(CPU):  # as DpLoaderSet.__getitem__
                batch = self.systems[lane][index].next_batch(generator)
            batch["sid"] = index
            yield self._pinned(self.collate_fn(batch))

    def _pinned(self, batch):
        if not self.pin_memory:
            return batch
        import torch

        if not torch.accelerator.is_available():
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, torch.accelerator.current_accelerator().type)

    def state(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "workers": self.num_workers,
            "pass": self.pass_state,
            "position": int(self.position),
            "generators": [g.get_state() for g in self.generators],
            "systems": [[s.state() for s in lane] for lane in self.systems],
        }

    def check(self, state: Any) -> str | None:
        """Why ``state`` cannot be restored here, or ``None``."""
        if not isinstance(state, dict) or state.get("kind") != KIND:
            return (
                "the checkpoint's data position was saved by an earlier version "
                "of the plugin, which drew other batches"
            )
        if int(state["workers"]) != self.num_workers:
            return (
                f"the checkpoint's data were drawn with NUM_WORKERS="
                f"{int(state['workers'])}, this run has {self.num_workers}"
            )
        lanes = state["systems"]
        if len(lanes) != self.lanes or any(
            len(lane) != len(self.dataset.dataloaders) for lane in lanes
        ):
            return "the data systems differ from the checkpoint's"
        return None

    def restore(self, state: dict[str, Any]) -> None:
        self.pass_state = state["pass"]
        self.position = int(state["position"])
        self.generators = [_generator(state=s) for s in state["generators"]]
        self.systems = [self._fresh_systems() for _ in range(self.lanes)]
        for lane, saved in zip(self.systems, state["systems"], strict=True):
            for system, one in zip(lane, saved, strict=True):
                system.restore(one)
        if self.pass_state is not None:
            self._order = self._draw_order(_generator(state=self.pass_state))
            self._resume = True


def resumable(dataset, sampler, kwargs: dict[str, Any]) -> bool:
    """Whether deepmd-kit's loader of ``dataset`` is drawn by :class:`ResumableLoader`.

    deepmd-kit 3.2 builds exactly this one: a ``DpLoaderSet``, a
    ``WeightedRandomSampler``, ``batch_size=None``, the default worker
    seeding and order. Anything else stays deepmd-kit's own loader.
    """
    from deepmd.pt.utils.dataloader import DpLoaderSet
    from torch.utils.data import WeightedRandomSampler

    known = {"num_workers", "batch_size", "drop_last", "collate_fn", "pin_memory"}
    return (
        isinstance(dataset, DpLoaderSet)
        and isinstance(sampler, WeightedRandomSampler)
        and sampler.generator is None
        and kwargs.get("batch_size", 1) is None
        and set(kwargs) <= known
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
    if not isinstance(states, list) or len(states) != len(loaders):
        return "the data loaders differ from the checkpoint's"
    for loader, state in zip(loaders, states, strict=True):
        if (loader is None) != (state is None):
            return "the data loaders differ from the checkpoint's"
        why = None if loader is None else loader.check(state)
        if why is not None:
            return why
    for loader, state in zip(loaders, states, strict=True):
        if loader is not None:
            loader.restore(state)
    return None
