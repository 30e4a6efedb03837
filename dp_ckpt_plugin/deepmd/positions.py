"""Where deepmd-kit's NumPy data systems are in their iteration, captured and restored.

``dp --pt-expt`` draws its batches from ``deepmd.utils.data_system.DeepmdDataSystem``:
``dp_random`` picks a system, and the system (a ``DeepmdData``) hands out
the next ``batch_size`` frames of its current set, which it loaded and
shuffled with ``dp_random`` when the previous one ran out. A system's
position is therefore:

- ``set_count``: how many sets it has loaded (the current one is
  ``dirs[(set_count - 1) % nsets]``);
- ``iterator``: the frames of that set handed out;
- ``order``: the frames of that set in their shuffled order, as indices into
  the set as read from disk. With one set, deepmd-kit shuffles the already
  shuffled frames again at each pass, so the order is the composition of
  every shuffle so far; :func:`track` records it as the shuffles happen.

Restoring reads the current set again and puts its frames in ``order``: the
cost is one set's read, whatever the step. The random generator that picks
systems and shuffles is restored by :mod:`.exact`.

LMDB data (``LmdbDataSystem``) keeps its position elsewhere; :func:`supported`
says so and exact resume is then off for the run, with that reason.
"""

from __future__ import annotations

from typing import Any


def supported(data_system: Any) -> bool:
    """Whether the position of ``data_system`` can be captured (NumPy systems)."""
    return data_system is None or hasattr(data_system, "data_systems")


def track(data_system: Any) -> None:
    """Record the frame order of each system of ``data_system`` from now on.

    Safe to call twice; a system that loaded a set before keeps deepmd-kit's
    behaviour but its order is recorded only from its next load.
    """
    if data_system is None:
        return
    for data in data_system.data_systems:
        if "_load_batch_set" in vars(data):
            continue  # tracked already
        data._dp_order = None
        data._load_batch_set = _tracking_load(data, type(data)._load_batch_set)


def _tracking_load(data: Any, load):
    def load_batch_set(set_name) -> None:
        fresh = not hasattr(data, "batch_set") or data.get_numb_set() > 1
        shuffles = []
        shuffle = data._shuffle_data

        def recording(frames):
            out, idx = shuffle(frames)
            shuffles.append(idx)
            return out, idx

        data._shuffle_data = recording
        try:
            load(data, set_name)
        finally:
            del data._shuffle_data
        (idx,) = shuffles
        previous = None if fresh else data._dp_order
        data._dp_order = idx if previous is None else previous[idx]

    return load_batch_set


def capture(data_system: Any) -> list[dict[str, Any]] | None:
    """The position of each system of ``data_system`` (``None`` for no data)."""
    if data_system is None:
        return None
    import torch

    systems = []
    for data in data_system.data_systems:
        order = getattr(data, "_dp_order", None)
        systems.append(
            {
                "set_count": int(data.set_count),
                "iterator": int(data.iterator),
                "order": None if order is None else torch.from_numpy(order.copy()),
            }
        )
    return [{"pick_idx": int(data_system.pick_idx)}, *systems]


def restore(data_system: Any, state: list[dict[str, Any]] | None) -> str | None:
    """Put ``data_system`` where :func:`capture` found it; return why not, or ``None``."""
    if data_system is None or state is None:
        return None if data_system is None and state is None else "data differ"
    head, systems = state[0], state[1:]
    if len(systems) != len(data_system.data_systems):
        return (
            f"the data have {len(data_system.data_systems)} system(s), the "
            f"checkpoint's {len(systems)}"
        )
    data_system.pick_idx = int(head["pick_idx"])
    for data, position in zip(data_system.data_systems, systems, strict=True):
        _restore_one(data, position)
    return None


def _restore_one(data: Any, position: dict[str, Any]) -> None:
    import numpy as np

    data.set_count = int(position["set_count"])
    data.iterator = int(position["iterator"])
    order = position["order"]
    if order is None or data.set_count == 0:
        data._dp_order = None
        if hasattr(data, "batch_set"):
            del data.batch_set
        return
    order = order.cpu().numpy().astype(np.int64)
    raw = data._load_set(data.dirs[(data.set_count - 1) % data.get_numb_set()])
    if data.modifier is not None:
        data.modifier.modify_data(raw, data)
    data.batch_set = reorder(raw, order)
    data._dp_order = order


def reorder(frames: dict[str, Any], order) -> dict[str, Any]:
    """``frames`` with its per-frame arrays taken in ``order``, as deepmd-kit shuffles."""
    import numpy as np

    nframes = frames["coord"].shape[0]

    def per_frame(key: str, value: Any) -> bool:
        return (
            isinstance(value, np.ndarray)
            and value.ndim == 2
            and value.shape[0] == nframes
            and "find_" not in key
        )

    return {k: v[order] if per_frame(k, v) else v for k, v in frames.items()}
