"""``dp-ckpt sync SRC DST``: copy a store between a directory and object storage.

- A local store to a remote one (``dp-ckpt sync models s3://bucket/run``):
  every committed checkpoint the remote store does not hold yet is uploaded
  as a training run uploads it (the writer lease taken, each file checked
  against its commit record from the handle it is sent from, payload, record,
  then HEAD), each family published as its pointer says (never back to an
  older step); nothing of the remote store is removed; the training inputs
  their records name go to ``inputs/``. The staging directory a run left
  checkpoints in that it could not upload is a local store too. Another
  run's store at the URL is archived first; a step held there with other
  bytes is refused (:func:`_another_run`, rule 46). Checkpoints that are a
  branch the URL's latest does not continue (a node cut off while another
  went on) are never sent (:func:`_dead_branches`, rule 47).
- A remote store to a directory (``dp-ckpt sync s3://bucket/run models``):
  every checkpoint HEAD keeps is downloaded, hashed on the way and committed
  with its record; the pointer and alias of each family then name what HEAD
  publishes. Checkpoints already there with the same record are not fetched
  again; another file at a name is archived, never overwritten. The training
  inputs their records name come along (``inputs/``, verified by digest).

Afterwards every checkpoint copied is verified at its destination (a remote
one downloaded and hashed; a local one was hashed as it was written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..checkpoint.layout import POINTER_NAME, Family
from ..checkpoint.provenance import input_path
from ..errors import CheckpointError, CheckpointWriteError
from ..objectstore.registry import storage_for
from ..remote.catalogue import expand
from ..remote.fetch import kept_input
from ..retention import KeepAll
from ..storage.local import LocalStorage
from ..store.family import FamilyConfig
from ..store.publish import publish, targets
from . import FAILURE, UsageError, is_remote, output
from .head_view import HeadView
from .views import Listing

HELP = "copy a store between a directory and object storage, verified"
DESCRIPTION = (
    "Copy a checkpoint store from a local directory to a remote store "
    "(s3://bucket/run) or back, as a training run would write it: committed "
    "checkpoints only, verified against their commit records, pointers "
    "published; nothing is removed at the destination."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``sync``."""
    parser.add_argument("source", help="a store directory, or a remote store's URL")
    parser.add_argument("destination", help="a remote store's URL, or a directory")


def run(args: argparse.Namespace) -> int:
    """Copy; exit status 1 if anything copied does not verify."""
    source, destination = args.source, args.destination
    if is_remote(source) == is_remote(destination):
        raise UsageError(
            "sync copies between a directory and a remote store (s3://...): "
            f"{source} and {destination} are both "
            + ("remote" if is_remote(source) else "local")
        )
    started = time.monotonic()
    if is_remote(destination):
        copied, problems = upload(Path(source), destination)
    else:
        copied, problems = download(source, Path(destination))
    size = sum(c["size"] for c in copied)
    seconds = time.monotonic() - started
    if args.json:
        output.print_json(
            {
                "source": str(source),
                "destination": str(destination),
                "copied": copied,
                "problems": problems,
                "bytes": size,
            }
        )
    else:
        for problem in problems:
            sys.stdout.write(f"{problem}\n")
        sys.stdout.write(
            f"copied {len(copied)} checkpoint(s), {size / 1e6:.1f} MB, from {source} "
            f"to {destination} in {seconds:.1f} s; "
            + ("all verified" if not problems else f"{len(problems)} did not verify")
            + "\n"
        )
    return 0 if not problems else FAILURE


def upload(directory: Path, url: str) -> tuple[list[dict], list[str]]:
    """Send the committed checkpoints of a local store to the store at ``url``."""
    from ..remote.factory import open_remote
    from ..remote.replica import NotSent
    from .inventory import read_inventory

    listing = read_inventory(directory)
    if not listing.items():
        raise UsageError(f"{directory} holds no committed checkpoint to send")
    local = LocalStorage(directory)
    _, remote = open_remote(
        url, format=listing.format or "torch", directory=directory, local=local
    )
    storage = remote.storage
    remote.start()
    copied, problems = [], []
    try:
        dead = _dead_branches(remote, listing, directory, local)
        _another_run(remote, listing, directory, dead)
        held = {
            (p, e.name, e.digest)
            for p, s in expand(storage, remote.head).families.items()
            for e in s.kept
        }
        for shelf in listing.families:
            config = FamilyConfig(shelf.family(), KeepAll())
            for checkpoint in shelf.checkpoints():
                key = (shelf.prefix, checkpoint.name, checkpoint.record.digest)
                if key in held or checkpoint.path in dead:
                    continue
                try:
                    entry = remote.send_now(config, checkpoint)
                except NotSent as exc:  # a corrupt or changed source checkpoint
                    problems.append(str(exc))
                    continue
                sent = storage.url_of(entry.key)
                copied.append(_copied(shelf.prefix, entry, url=sent))
                problem, _ = HeadView(storage).problem(entry, digest=True)
                if problem is not None:
                    problems.append(f"{sent}: {problem}")
            pointed = shelf.latest
            if pointed is not None and directory / pointed not in dead:
                state = remote.head.family(shelf.prefix)
                chosen = next((e for e in state.kept if e.name == pointed), None)
                newest = state.published.step if state.published else -1
                if chosen is not None and chosen.step > newest:  # never back
                    remote.publish(shelf.prefix, chosen)
    finally:
        remote.close(wait=0)
    return copied, problems


def _copied(family: str, entry, **where: str) -> dict:
    """One checkpoint copied, as ``--json`` names it (its ``url`` or ``path``)."""
    return {"family": family, "step": entry.step, "size": entry.size, **where}


def _dead_branches(remote, listing: Listing, directory: Path, local) -> set[Path]:
    """The source's checkpoints that are a branch ``U`` does not continue (rule 47).

    Each family's are judged as a run's start judges its staging directory
    (:mod:`~dp_ckpt_plugin.remote.branches`); those that are dead are never
    sent, and are moved into an archive of the source (unless a run holds its
    lock), with one line naming both branches.
    """
    from ..remote import branches
    from ..store.archive import archive
    from ..store.lock import StoreLock

    dead: set[Path] = set()
    for shelf in listing.families:
        state = remote.head.family(shelf.prefix)
        found = branches.sort(state, shelf.checkpoints()).dead
        if not found:
            continue
        dead |= {c.path for c in found}
        lock = StoreLock(directory, storage=local)
        try:
            lock.acquire()
        except CheckpointError as exc:
            where = f"left where they are ({exc})"
        else:
            try:
                dest = archive(directory, found, storage=local, durable=True)
                where = f"kept in {dest}"
            finally:
                lock.release()
        line = branches.dead_line(remote.url, shelf.prefix, state, found, where)
        sys.stderr.write(f"dp-ckpt: {line}\n")
    return dead


def _another_run(remote, listing: Listing, directory: Path, dead=frozenset()) -> None:
    """Archive the destination's store first when it is another run's (rule 46).

    The destination holds another run when it shares no checkpoint with the
    source (by family, step and digest) and the source's steps do not all
    lie above its newest (a staging directory that could not upload does);
    it is archived as a fresh run archives (``U/archive/<UTC>.json``,
    nothing deleted). A step both hold with different bytes is another
    branch: refused, nothing copied.
    """
    head = expand(remote.storage, remote.head)  # its segments' entries too
    held = {(p, e.step): e for p, s in head.families.items() for e in s.kept}
    if not held:
        return
    ours = {(c.family, c.step): c for c in listing.checkpoints() if c.path not in dead}
    for (prefix, step), checkpoint in sorted(ours.items()):
        entry = held.get((prefix, step))
        if entry is not None and entry.digest != checkpoint.record.digest:
            raise CheckpointWriteError(
                f"{remote.url} holds another {prefix} step {step} than "
                f"{checkpoint.path} (another run or another branch of it); nothing "
                "was copied: sync into another URL"
            )
    if any(key in held for key in ours):
        return  # the same run: what is missing is sent
    newest = {
        p: max(e.step for e in s.kept) for p, s in head.families.items() if s.kept
    }
    if all(step > newest.get(prefix, -1) for prefix, step in ours):
        return  # the same run, continued where the destination stops
    key = remote.archive(lambda prefix, entry: False)
    steps = sorted({step for _, step in held})
    sys.stderr.write(
        f"dp-ckpt: {remote.url} held another run (steps "
        f"{', '.join(map(str, steps))}): archived in {remote.storage.url_of(key)} "
        f"before {directory} was copied, as a fresh run does\n"
    )


def _fetch_input(storage, record, directory: Path, local: LocalStorage) -> None:
    """The training input ``record`` names, from ``inputs/`` of the remote store
    (left out when it is not kept there, a run before provenance: show says so)."""
    origin = record.provenance
    if origin is None or origin.input is None:
        return
    path = input_path(directory, origin.input)
    if local.entry(path) is None and (found := kept_input(storage, origin.input)):
        local.make_dirs(path.parent, durable=True)
        local.write_atomic(path, found[0], durable=True)


def download(url: str, directory: Path) -> tuple[list[dict], list[str]]:
    """Fetch every checkpoint the store at ``url`` keeps into ``directory``."""
    from ..remote.fetch import Found, fetch, record_of
    from ..store.lock import StoreLock

    storage = storage_for(url)
    head = HeadView(storage).head()
    local = LocalStorage(directory)
    local.make_dirs(directory, durable=True)
    copied, problems = [], []
    with StoreLock(directory, storage=local):
        for prefix, state in head.families.items():
            for entry in state.kept:
                try:
                    record = record_of(storage, entry)
                    found = Found(storage.url, prefix, entry, record, "sync")
                    path = fetch(storage, found, directory, local)
                except CheckpointError as exc:
                    problems.append(f"{storage.url_of(entry.key)}: {exc}")
                    continue
                copied.append(_copied(prefix, entry, path=str(path)))
                _fetch_input(storage, record, directory, local)
            published = state.published
            if published is not None and local.entry(directory / published.name):
                suffix = published.name[len(f"{prefix}-{published.step}") :]
                family = Family(prefix, suffix, state.pointer or POINTER_NAME)
                pointers = targets(directory, family)
                publish(directory / published.name, pointers, storage=local)
    return copied, problems
