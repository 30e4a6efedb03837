"""Lineage: which checkpoint a checkpoint continued from (nothing here touches a file).

A checkpoint is named in a lineage by a :class:`Link`: the *epoch* of the run
that committed it (the writer epoch of its remote store; 0 for a run with no
remote store), its step and its digest. A run is one line: each checkpoint
it commits continues from its previous one, the first from the checkpoint
the run resumed from. So a chain of checkpoints is told by its *segments*,
the newest checkpoint of each run along it, oldest first (:func:`chain_of`),
and whether a checkpoint ``L`` lies on the chain of another costs one pass
over those segments (:func:`on_chain`), whatever the chain's length:
``L`` is on it when a segment is ``L`` itself, or a later checkpoint of
``L``'s run (epoch above 0: one run, one line).

A commit record carries its :class:`Lineage` (its run's epoch, and the
segments of its parent's chain, the parent last); records written before it
carry none and are still read. A chain keeps its newest ``MAX_LINEAGE``
segments (``checkpoint/limits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import MAX_DIGEST_TEXT, MAX_LINEAGE, check_int, is_int, is_text


@dataclass(frozen=True)
class Link:
    """One checkpoint in a lineage: its run's epoch, its step, its digest."""

    epoch: int
    step: int
    digest: str

    def to_list(self) -> list:
        return [self.epoch, self.step, self.digest]

    def check(self) -> None:
        """Refuse (``ValueError``) a field beyond what readers accept."""
        check_int(self.epoch, "a lineage's epoch")
        check_int(self.step, "a lineage's step")
        if not is_text(self.digest, MAX_DIGEST_TEXT):
            raise ValueError("a lineage's digest must be a short string")

    @classmethod
    def parse(cls, raw: object) -> Link | None:
        """A link read from a record or HEAD (``[epoch, step, digest]``), or ``None``."""
        if type(raw) is not list or len(raw) != 3:
            return None
        epoch, step, digest = raw
        if not (is_int(epoch) and is_int(step) and is_text(digest, MAX_DIGEST_TEXT)):
            return None
        return cls(epoch, step, digest)

    def __str__(self) -> str:
        return f"step {self.step} (epoch {self.epoch})"


@dataclass(frozen=True)
class Lineage:
    """What a committed checkpoint continued from.

    Attributes
    ----------
    epoch : int
        The epoch of the run that committed it (0: a run with no remote store).
    chain : tuple of Link
        The segments of its parent's chain, oldest first, the parent last;
        empty for a checkpoint that continued from nothing.
    """

    epoch: int
    chain: tuple[Link, ...] = ()

    @property
    def parent(self) -> Link | None:
        """The checkpoint it continued from."""
        return self.chain[-1] if self.chain else None

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "chain": [link.to_list() for link in self.chain]}

    def check(self) -> None:
        """Refuse (``ValueError``) a field beyond what readers accept."""
        check_int(self.epoch, "a lineage's epoch")
        if len(self.chain) > MAX_LINEAGE:
            raise ValueError(f"a lineage holds at most {MAX_LINEAGE} links")
        for link in self.chain:
            link.check()

    @classmethod
    def parse(cls, raw: object) -> Lineage | None:
        """A lineage read from a record, or ``None`` when malformed."""
        if type(raw) is not dict or set(raw) != {"epoch", "chain"}:
            return None
        epoch, chain = raw["epoch"], raw["chain"]
        if not is_int(epoch) or type(chain) is not list or len(chain) > MAX_LINEAGE:
            return None
        links = tuple(Link.parse(item) for item in chain)
        return None if None in links else cls(epoch, links)


def chain_of(lineage: Lineage | None, step: int, digest: str) -> tuple[Link, ...]:
    """The segments of the chain of a checkpoint (itself last), or ``()`` unknown."""
    if lineage is None:
        return ()
    me = Link(lineage.epoch, step, digest)
    chain = lineage.chain
    if chain and lineage.epoch and chain[-1].epoch == lineage.epoch:
        chain = chain[:-1]  # the same run: this checkpoint is its segment's newest
    return (*chain, me)[-MAX_LINEAGE:]


def on_chain(chain: tuple[Link, ...], link: Link) -> bool:
    """Whether the checkpoint ``link`` lies on ``chain`` (see the module docs)."""
    return any(
        segment == link
        or (segment.epoch and segment.epoch == link.epoch and segment.step > link.step)
        for segment in chain
    )


def describe(chain: tuple[Link, ...]) -> str:
    """A chain's newest checkpoint, for a person (``step 80 (epoch 1)``)."""
    return str(chain[-1]) if chain else "a checkpoint of unknown lineage"
