"""Which staged checkpoints a remote store may take: those that continue its latest.

A node cut off before its uploads keeps committed checkpoints in its staging
directory; meanwhile another node may have resumed from HEAD, under a newer
epoch, and gone on. Those staged checkpoints are then a dead branch: uploading
them would move HEAD's latest onto it, and every node would resume from it.
So a staged checkpoint is uploaded only when HEAD's latest of its family lies
on its chain (:func:`~dp_ckpt_plugin.checkpoint.lineage.on_chain`: one pass
over the segments its record carries, against the lineage HEAD keeps of its
newest entry), or HEAD keeps nothing of the family. One on HEAD's own chain
(an older step it went through) is left alone; any other is *dead*: it stays
local, moved into an archive of the staging directory (never deleted), with
one line naming both branches (:func:`dead_line`). Checkpoints whose lineage
is unknown (records or HEADs written before lineage was recorded), or whose
chain never meets HEAD's (another run's store), follow the rule of before: a
step above HEAD's newest is uploaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..checkpoint import Checkpoint
from ..checkpoint.lineage import Link, chain_of, describe, on_chain
from .head import FamilyState

#: What :func:`judge` answers.
CONTINUES, ON_HEAD, DEAD = "continues", "on HEAD's chain", "dead"


def chain(checkpoint: Checkpoint) -> tuple[Link, ...]:
    """The chain of a committed checkpoint; ``()`` when its lineage is unknown."""
    record = checkpoint.record
    return chain_of(record.lineage, record.step, record.digest)


def chain_of_entry(entry, record) -> tuple[Link, ...]:
    """The chain of a remote entry from its commit record; ``()`` when unknown."""
    return chain_of(record.lineage, entry.step, entry.digest)


def judge(state: FamilyState, checkpoint: Checkpoint) -> str:
    """Whether ``checkpoint`` continues the family's latest in HEAD (``state``)."""
    newest = state.newest()
    if newest is None:
        return CONTINUES
    tip, mine = state.tip, chain(checkpoint)
    if tip is None or not mine:
        return CONTINUES if checkpoint.step > newest.step else ON_HEAD
    if on_chain(mine, tip):
        return CONTINUES if mine[-1] != tip else ON_HEAD
    if on_chain(state.lineage, mine[-1]):
        return ON_HEAD
    if not shares(mine, state.lineage):  # another run's store: the rule of before
        return CONTINUES if checkpoint.step > newest.step else ON_HEAD
    return DEAD


def shares(one: tuple[Link, ...], other: tuple[Link, ...]) -> bool:
    """Whether two chains meet (one's checkpoint lies on the other's chain)."""
    return any(on_chain(other, link) for link in one) or any(
        on_chain(one, link) for link in other
    )


@dataclass
class Sorted:
    """A family's staged checkpoints, judged against HEAD."""

    continuing: list[Checkpoint] = field(default_factory=list)
    dead: list[Checkpoint] = field(default_factory=list)

    @property
    def newest(self) -> Checkpoint | None:
        """The newest checkpoint that continues HEAD (what a start uploads)."""
        return max(self.continuing, key=lambda c: c.step, default=None)


def sort(state: FamilyState, checkpoints: Iterable[Checkpoint]) -> Sorted:
    """Judge each of ``checkpoints`` (see :func:`judge`)."""
    found = Sorted()
    for checkpoint in checkpoints:
        verdict = judge(state, checkpoint)
        if verdict == CONTINUES:
            found.continuing.append(checkpoint)
        elif verdict == DEAD:
            found.dead.append(checkpoint)
    return found


def dead_line(url: str, prefix: str, state: FamilyState, dead, where: str) -> str:
    """The one line that says a staged branch is dead, naming both branches."""
    newest = max(dead, key=lambda c: c.step)
    steps = ", ".join(str(c.step) for c in sorted(dead, key=lambda c: c.step))
    return (
        f"{prefix} step(s) {steps} committed in {newest.path.parent} are a dead "
        f"branch: {url} does not continue them (this branch's newest: "
        f"{describe(chain(newest))}; {url}'s latest, on the branch another run "
        f"went on with: {describe(state.lineage)}); NOT uploaded, never "
        f"published; {where}"
    )
