"""``on_resolve_restart`` for remote stores (the built-in plugin ``remote``).

It answers, when the run's ``save_dir`` is a remote store
(``context.remote``): ``latest``, ``best``, the store's own URL and the name
or key of one of its checkpoints; and, for any run, the URL of a remote store
or of a checkpoint in one (``s3://bucket/run``,
``s3://bucket/run/e000002/model.ckpt-30.pt``). The checkpoint is found through
HEAD and its record (:func:`~dp_ckpt_plugin.remote.fetch.find`) and
downloaded into the staging directory, its record beside it
(:func:`~dp_ckpt_plugin.remote.fetch.fetch`: bytes that do not match the
record get no name there, and ``latest`` falls back to the previous
checkpoint). What the front door gets is that local path alone: it reads the
record beside it and verifies the file as it verifies any file
(:func:`~dp_ckpt_plugin.resolution.admit`). Anything else is left to the other
rules.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import Checkpoint
from ..errors import CheckpointError, RestartNotFoundError
from ..markers import hookimpl
from ..resolution import ResolveContext, Resolved
from ..resolution.sources import RemoteSource
from ..storage.objects import ObjectStorage
from ..storage.staging import staging_dir
from .fetch import LATEST, fetch_first, read_head
from .head import read

#: How many folders above a checkpoint's URL its store's HEAD is looked for.
_LEVELS = 3


@hookimpl(trylast=True)
def on_resolve_restart(spec, context):
    """Answer remote specifications; leave anything else."""
    if context is None or not isinstance(spec, str):
        return None
    source = context.remote
    if source is not None:
        url = source.storage.url
        if spec in (*LATEST, "best", url, f"{url}/"):
            name = "latest" if spec in (url, f"{url}/") else spec
            return _resolved(source, name, context)
        if spec.startswith(f"{url}/"):
            return _resolved(source, spec[len(url) + 1 :], context)
        bare = "://" not in spec and "/" not in spec
        if bare and (context.family.step_of(spec) is not None or _named(source, spec)):
            return _resolved(source, spec, context)
    if "://" not in spec or spec.startswith("file://"):
        return None
    return _elsewhere(spec, context)


def _named(source: RemoteSource, spec: str) -> bool:
    try:
        return read_head(source.storage).find(spec) is not None
    except CheckpointError:
        return False


def _elsewhere(spec: str, context) -> Resolved:
    """A URL of another store (or of a checkpoint in one)."""
    storage, rest = store_above(spec)
    staging = context.remote.staging if context.remote else None
    local = context.remote.local if context.remote else context.storage
    source = RemoteSource(storage, fetch_cache(staging, storage.url), local)
    return _resolved(source, rest, context)


def store_above(url: str) -> tuple[ObjectStorage, str]:
    """The storage of the store with a HEAD at ``url`` or up to
    :data:`_LEVELS` folders above it, and what of ``url`` lies below it
    (``"latest"`` when nothing).

    Raises
    ------
    RestartNotFoundError
        When no HEAD is there.
    """
    from ..objectstore.registry import storage_for

    base, rest = url.rstrip("/"), ""
    for _ in range(_LEVELS + 1):
        storage = storage_for(base)
        if read(storage)[0] is not None:
            return storage, rest or "latest"
        base, _, last = base.rpartition("/")
        rest = f"{last}/{rest}".rstrip("/")
        if base.endswith(":/") or "://" not in base or base.split("://", 1)[1] == "":
            break
    raise RestartNotFoundError(
        f"{url} names no checkpoint store: no HEAD at it or above it"
    )


def fetch_cache(staging: Path | None, url: str) -> Path:
    """Where checkpoints of another remote store are fetched to.

    Beside the staging directory (never inside a store directory, so a
    checkpoint of another store never counts as one of this run's).
    """
    base = staging.parent.parent if staging is not None else None
    return staging_dir(url, base=base, purpose="fetched")


def _resolved(source: RemoteSource, spec: str, context: ResolveContext) -> Resolved:
    """The local copy of what ``spec`` names: a path, for the front door to check.

    A copy already staged has its record read through the context's verifier,
    which the front door reads it from next: once.
    """
    family, records = context.family.prefix, context.verifier.record
    found, path, warnings = fetch_first(source.storage, spec, family, source, records)
    return Resolved(
        Checkpoint(path, None, None),
        "unverified",
        f"{found.how} ({found.key_url})",
        warnings,
        rule="remote",
        fell_back=found.fell_back,
        source=found,
    )
