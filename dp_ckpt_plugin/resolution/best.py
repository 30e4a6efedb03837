"""``best``: the restart specification naming a store's best checkpoint.

A family kept by a :class:`~dp_ckpt_plugin.retention.KeepBest` alone (a
family of best-validation checkpoints, say) is *ranked*: its commit records
carry the metric, and its pointer and alias name its best checkpoint rather
than its newest. This built-in plugin (registered as ``best``) answers
``on_resolve_restart`` for

- ``best``: the best checkpoint of the store (``context.store_dir``, else the
  working directory): of its first ranked family, else of the first family
  whose policy keeps the best by a metric beside other rules;
- ``best:<directory>``: the same in another store directory.

The store's manifest (:mod:`~dp_ckpt_plugin.checkpoint.manifest`) says which family is
ranked and by which metric; the ranking itself is read from the commit
records, so a lost or stale pointer does not matter. Each candidate, best
first, is checked like any restart (:func:`~dp_ckpt_plugin.resolution.builtin.resolve`
on the file); a corrupt one is moved aside into ``quarantine/`` (when the
context allows) and the next best is tried, with a warning naming both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..checkpoint.catalogue import committed
from ..checkpoint.layout import Family
from ..checkpoint.manifest import read_manifest
from ..errors import CorruptCheckpointError, InvalidRecordError, RestartNotFoundError
from ..markers import hookimpl
from ..retention import KeepBest, ranking_of
from ..storage import Storage
from . import ResolveContext, Resolved
from .builtin import resolve
from .quarantine import set_aside

#: The restart specification this plugin answers.
SPEC = "best"


@hookimpl(trylast=True)
def on_resolve_restart(spec, context):
    """Answer ``best`` and ``best:<directory>``; leave anything else."""
    if context is None or not isinstance(spec, str):
        return None
    head, colon, rest = spec.partition(":")
    if head != SPEC or (colon and not rest.strip()):
        return None
    directory = Path(rest) if colon else context.store_dir or context.cwd
    return resolve_best(context.cwd / directory, context, spec=spec)


def ranked_family(
    directory: Path, *, storage: Storage | None = None
) -> tuple[Family, KeepBest] | None:
    """The family of the store at ``directory`` that ``best`` ranks, and how.

    The first family kept by a :class:`~dp_ckpt_plugin.retention.KeepBest`
    alone (a family of best checkpoints), else the first whose policy holds
    one beside other rules; ``None`` when no family is kept by a metric.
    """
    try:
        manifest = read_manifest(directory, storage=storage)
    except InvalidRecordError as exc:
        raise RestartNotFoundError(f"cannot resolve {SPEC!r}: {exc}") from None
    found = []
    for info in manifest.families if manifest else ():
        policy = info.retention()
        ranking = ranking_of(policy) if policy is not None else None
        if ranking is not None:
            found.append((policy is not ranking, info.family, ranking))
    # the first kept by a KeepBest alone (False sorts first), else the first
    return min(found, key=lambda f: f[0])[1:] if found else None


def resolve_best(directory: Path, context: ResolveContext, *, spec: str) -> Resolved:
    """Resolve the best committed checkpoint of ``directory``'s ranked family.

    Raises
    ------
    RestartNotFoundError
        When the store has no ranked family, or none of its checkpoints
        carries the metric and passes its check.
    """
    storage = context.storage
    found = ranked_family(directory, storage=storage)
    if found is None:
        raise RestartNotFoundError(
            f"no checkpoint found for restart {spec!r}: {directory} has no family "
            "kept by a metric (its .dp_ckpt.store.json names no keep_best policy)"
        )
    family, ranking = found
    ranked = ranking.rank(
        c.candidate() for c in committed(directory, family, storage=storage)
    )
    if not ranked:
        raise RestartNotFoundError(
            f"no checkpoint found for restart {spec!r}: no committed "
            f"{family.prefix}-<step>{family.suffix} checkpoint in {directory} "
            f"carries the metric {ranking.metric!r}"
        )
    ctx = dataclasses.replace(context, family=family)
    skipped: list[str] = []
    for candidate in ranked:
        path = directory / candidate.name
        try:
            chosen = resolve(str(path), ctx)
        except CorruptCheckpointError as exc:
            skipped.append(set_aside(path, exc, context)[1])
        except RestartNotFoundError as exc:  # its record changed meanwhile
            skipped.append(str(exc))
        else:
            chosen.how = f"{ranking.reason} in {directory}"
            chosen.rule, chosen.via = "best", directory
            if skipped:
                chosen.warnings[:0] = skipped
                chosen.warnings.append(f"falling back to {path}, the next best")
                chosen.fell_back = True
            return chosen
    raise RestartNotFoundError(
        f"no checkpoint found for restart {spec!r}: every ranked checkpoint in "
        f"{directory} failed its check:\n" + "\n".join(f"  - {s}" for s in skipped)
    )
