"""A remote store's HEAD grown to any size, as its writer grows it.

Shared by the segment tests and the counted benchmark
(``benchmarks/bench_remote_counts.py``), which builds stores of 100,000
checkpoints without saving each one.
"""

from __future__ import annotations

from collections.abc import Callable

from dp_ckpt_plugin.remote import catalogue
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import HEAD_KEY


def grow(storage, prefix: str, count: int, entry: Callable[[int], heads.Entry]) -> None:
    """Make HEAD keep steps 1..count-1 of ``prefix`` besides its newest.

    As the writer would: full segments of ``SPILL`` entries, named by
    segments of the next level once ``FANOUT`` of a level are named, the
    rest in HEAD. ``entry(step)`` is the entry of one step.
    """
    head, version = heads.read(storage)
    state = head.family(prefix)
    older = [entry(s) for s in range(1, count)]
    whole = len(older) - len(older) % catalogue.SPILL
    n = 1_000
    for at in range(0, whole, catalogue.SPILL):
        segment = catalogue.write_segment(
            storage, 1, n, prefix, older[at : at + catalogue.SPILL]
        )
        n += 1
        state = heads.FamilyState(
            state.kept,
            state.latest,
            state.pointer,
            state.lineage,
            (*state.segments, segment),
        )
        while merging := catalogue.merge_plan(state):
            parent = catalogue.write_segment(storage, 1, n, prefix, children=merging)
            n += 1
            state = (
                head._with(prefix, state)
                .resegmented(prefix, [s.key for s in merging], [parent])
                .family(prefix)
            )
    kept = tuple(sorted([*older[whole:], *state.kept], key=lambda e: e.step))
    grown = head._with(
        prefix,
        heads.FamilyState(
            kept, state.latest, state.pointer, state.lineage, state.segments
        ),
    )
    storage.put_if_match(HEAD_KEY, grown.to_bytes(), version)
