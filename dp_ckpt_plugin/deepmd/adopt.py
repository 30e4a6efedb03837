"""Adopting a ``save_dir`` that plain deepmd-kit wrote.

deepmd-kit 3.2 alone writes numbered checkpoints into ``save_dir`` without
commit records (and its ``checkpoint`` pointer into the working directory).
When a run of the plugin opens such a directory as its writer, each numbered
file of the run's families that has no record is read once, checked by
the checksums it carries (rule 50) and by loading those bytes with
``torch.load(weights_only=True)`` and, if they pass and load,
given the commit record that describes them: from then on ``latest`` and
``--restart <save_dir>`` find it, retention counts it, and a run that starts
its own step count archives it. A file that does not load is left alone with
a warning; a file whose record exists but is malformed is never touched (the
record is evidence).

When plain deepmd-kit continued a run of the plugin, its newer files are
adopted and the family is published at the newest of them through the
store's publisher (its pointer, alias and mirrors), so that ``latest`` names
what deepmd-kit's working-directory pointer names.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..checkpoint import Checkpoint
from ..checkpoint.catalogue import committed
from ..checkpoint.pointers import named_by
from ..formats.checksums import check_carried
from ..storage import PayloadBytes
from ..store.adoption import adopt_family
from ..store.core import CheckpointStore
from .logs import shown

log = logging.getLogger("dp_ckpt_plugin")


def loads_with_torch(payload: PayloadBytes) -> None:
    """Raise unless a file's bytes pass their own checksums (rule 50) and load
    with ``torch.load(weights_only=True)`` as a dict."""
    import torch

    check_carried(payload)  # a damaged member is named, not just "does not load"

    state = torch.load(payload.reader(), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a state dict")


def adopt(store: CheckpointStore, *, cwd: Path | None = None) -> list[Checkpoint]:
    """Give commit records to the numbered files of ``store`` that have none.

    Called on the chief with the store open (its lock held). Returns the
    checkpoints adopted, oldest first.
    """
    adopted: list[Checkpoint] = []
    for cfg in store.families.values():
        found = adopt_family(
            store.directory,
            cfg.family,
            store.format.name,
            loads_with_torch,
            storage=store.storage,
            durable=store.durable,
        )
        for path, why in found.refused:
            log.warning(
                "%s has no commit record and does not load with torch (%s); "
                "left as it is",
                shown(path, cwd),
                why,
            )
        if found.adopted:
            store.catalogue.invalidate()  # it holds the adopted ones from now on
            _publish_if_newer(store, cfg, found.adopted[-1])
            adopted += found.adopted
    if adopted:
        steps = sorted({c.step for c in adopted})
        log.info("%s", adopted_line(len(adopted), shown(store.directory, cwd), steps))
    return adopted


def adopted_line(count: int, directory: str, steps: list[int]) -> str:
    """What a run says when it adopted the files plain deepmd-kit wrote."""
    return (
        f"adopted {count} checkpoint(s) that plain deepmd-kit wrote in {directory} "
        f"(steps {', '.join(map(str, steps))}): each loads with torch and now has "
        "a commit record, so it counts for --restart latest and for retention"
    )


def _publish_if_newer(store: CheckpointStore, cfg, newest: Checkpoint) -> None:
    """Move the store's pointer and alias to ``newest`` if they name an older step."""
    family = cfg.family
    links = named_by(store.directory, family, storage=store.storage)
    named = links["pointer"] or links["alias"]
    named_step = family.step_of(named) if named else None
    if named_step is not None and named_step >= newest.step:
        return
    if named_step is None and any(
        c.step > newest.step
        for c in committed(store.directory, family, storage=store.storage)
    ):
        return
    store.publisher.publish(cfg, newest)
