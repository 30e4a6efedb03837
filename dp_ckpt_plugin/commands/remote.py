"""The ``dp-ckpt`` commands on a store on object storage (``s3://bucket/run``).

``ls``, ``verify``, ``resolve``/``show``, ``inspect`` and ``prune`` take the
store's URL where they take a directory (``inspect`` and ``resolve`` also a
checkpoint's URL). Everything is read through the store's HEAD and commit
records, never by listing; ``verify`` hashes each payload as it streams
(nothing is written to disk); ``inspect`` fetches the payload, verified, into
a cache beside the staging directories; ``prune`` takes the writer lease, as
a training run would, so it never races one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..checkpoint.digests import hasher
from ..errors import CheckpointError, RestartNotFoundError
from ..objectstore.registry import storage_for
from ..remote import head as heads
from ..remote.catalogue import SPILL, expand, leaves, write_segment
from ..remote.fetch import LATEST, candidates, fell_back, fetch_first
from ..remote.keys import owned, parse_key
from ..remote.lease import Lease
from ..resolution.sources import RemoteSource
from ..retention import KeepLast, plan_prune
from ..text import MAX_LOG_LINE, shown
from . import FAILURE, UsageError, is_remote, output
from .origins import input_text, provenance_json, provenance_rows

#: Each command, and the attribute of its arguments that may hold a URL.
URL_ARGUMENT = {
    "ls": "directory",
    "verify": "path",
    "resolve": "directory",
    "show": "directory",
    "inspect": "path",
    "prune": "directory",
}


def applies(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask a command about a remote store."""
    name = URL_ARGUMENT.get(args.command)
    if name is None:
        return False
    if is_remote(getattr(args, name, None)):
        return True
    return args.command in ("resolve", "show") and is_remote(
        getattr(args, "spec", None)
    )


def run(args: argparse.Namespace) -> int:
    """Run ``args.command`` on the remote store its arguments name."""
    return {
        "ls": ls,
        "verify": verify,
        "resolve": resolve,
        "show": resolve,
        "inspect": inspect,
        "prune": prune,
    }[args.command](args)


# -- ls ---------------------------------------------------------------------------


def ls(args: argparse.Namespace) -> int:
    """Every checkpoint HEAD keeps, family by family; archives; the lease."""
    storage = storage_for(args.directory)
    head = _head(storage)
    lease = _lease(storage)
    families = _families(head, getattr(args, "family", None), storage.url)
    data = {
        "store": storage.url,
        "head": {"seq": head.seq, "epoch": head.epoch, "format": head.format},
        "lease": lease,
        "families": [
            {
                "family": prefix,
                "checkpoints": [
                    {
                        **entry.to_dict(),
                        "url": storage.url_of(entry.key),
                        "published": entry.key == state.latest,
                    }
                    for entry in state.kept
                ],
            }
            for prefix, state in families
        ],
        "archives": list(head.archives),
    }
    if args.json:
        output.print_json(data)
        return 0
    out = output.console()
    holder = (
        f"held by {lease['holder']} (epoch {lease['epoch']})"
        if lease and not lease["released"]
        else "not held"
    )
    out.print(f"{storage.url}: HEAD seq {head.seq}, epoch {head.epoch}; lease {holder}")
    for family in data["families"]:
        out.print(
            f"{shown(family['family'])}: {len(family['checkpoints'])} checkpoint(s)"
        )
        for c in family["checkpoints"]:
            mark = "  <- latest" if c["published"] else ""
            out.print(
                f"  step {c['step']:>8}  {_mb(c['size']):>10}  {shown(c['key'])}{mark}"
            )
    for archive in head.archives:
        out.print(f"archive: {shown(storage.url_of(archive))}")
    return 0


def _families(head, prefix: str | None, url: str):
    found = [(p, s) for p, s in head.families.items() if prefix in (None, p)]
    if prefix is not None and not found:
        known = ", ".join(head.families) or "none"
        raise UsageError(f"{url} has no family {prefix!r} (families: {known})")
    return found


def _lease(storage) -> dict[str, Any] | None:
    try:
        state, _ = Lease(storage).read()
    except CheckpointError:
        return None
    if state is None:
        return None
    return {
        "epoch": state.epoch,
        "holder": state.holder.describe(),
        "renewed": state.renewed,
        "ttl": state.ttl,
        "released": state.released,
    }


def _head(storage):
    """HEAD with its catalogue segments' entries (every kept entry), or one line."""
    try:
        head, _ = heads.read(storage)
        if head is not None:
            head = expand(storage, head)
    except CheckpointError as exc:
        raise RestartNotFoundError(str(exc)) from None
    if head is None:
        raise RestartNotFoundError(f"{storage.url} is not a checkpoint store (no HEAD)")
    return head


def primary(head) -> str:
    """The family ``latest`` means in a remote store: its first (the periodic one)."""
    return next(iter(head.families), "model.ckpt")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


# -- verify -----------------------------------------------------------------------


class _Hashing:
    """A sink that hashes what a download writes and keeps nothing."""

    def __init__(self, algorithm: str) -> None:
        self.hash = hasher(algorithm)
        self.size = 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return len(data)


def verify(args: argparse.Namespace) -> int:
    """Check every kept checkpoint against its record (digest by default)."""
    storage = storage_for(args.path)
    head = _head(storage)
    digest = not getattr(args, "size_only", False)
    rows, hashed, started = [], 0, time.monotonic()
    for prefix, state in head.families.items():
        for entry in state.kept:
            problem = _check(storage, entry, digest)
            if digest and problem is None:
                hashed += entry.size
            rows.append(
                {
                    "family": prefix,
                    "step": entry.step,
                    "key": entry.key,
                    "url": storage.url_of(entry.key),
                    "problem": problem,
                }
            )
    seconds = max(time.monotonic() - started, 1e-9)
    sound = sum(1 for r in rows if r["problem"] is None)
    if args.json:
        output.print_json(
            {
                "store": storage.url,
                "checked": "digest" if digest else "size",
                "checkpoints": rows,
                "sound": sound,
                "hashed_bytes": hashed,
            }
        )
    else:
        for row in rows:
            if row["problem"]:
                sys.stdout.write(f"{shown(row['url'])}: {shown(row['problem'])}\n")
        rate = (
            f", {hashed / 1e6:.1f} MB hashed at {hashed / 1e6 / seconds:.1f} MB/s"
            if digest
            else ""
        )
        sys.stdout.write(
            f"{sound} of {len(rows)} checkpoint(s) of {storage.url} sound "
            f"({'size and digest' if digest else 'size only'}{rate})\n"
        )
    return 0 if sound == len(rows) else FAILURE


def _check(storage, entry, digest: bool) -> str | None:
    from ..remote.fetch import _record

    try:
        record = _record(storage, entry)
        found = storage.head(entry.key)
        if found is None:
            return "missing"
        if found.size != record.size:
            return f"{found.size} bytes, its record says {record.size}"
        if digest:
            sink = _Hashing(record.algorithm)
            storage.download(entry.key, sink)
            actual = f"{record.algorithm}:{sink.hash.hexdigest()}"
            if actual != record.digest:
                return "its content does not match the digest of its record"
    except CheckpointError as exc:
        return str(exc)
    return None


# -- resolve, show ------------------------------------------------------------------


def _split(spec: str, directory: object) -> tuple[object, str]:
    """The store and the specification inside it."""
    if is_remote(directory):
        return storage_for(directory), spec
    from ..remote.resolver import _LEVELS

    base, rest = spec.rstrip("/"), ""
    for _ in range(_LEVELS + 1):
        storage = storage_for(base)
        if heads.read(storage)[0] is not None:
            return storage, rest or "latest"
        base, _, last = base.rpartition("/")
        rest = f"{last}/{rest}".rstrip("/")
        if "://" not in base or base.split("://", 1)[1] == "":
            break
    raise RestartNotFoundError(
        f"{spec} names no checkpoint store: no HEAD at it or above it"
    )


def resolve(args: argparse.Namespace) -> int:
    """What ``--restart SPEC`` would use in the remote store, without downloading it."""
    storage, spec = _split(args.spec, args.directory)
    found = _present(storage, spec)
    url = storage.url_of(found.entry.key)
    for warning in found.warnings:
        sys.stderr.write(f"dp-ckpt: warning: {shown(warning, MAX_LOG_LINE)}\n")
    if getattr(args, "path_only", False):
        sys.stdout.write(shown(url, MAX_LOG_LINE) + "\n")
        return 0
    data = {
        "spec": args.spec,
        "url": url,
        "step": found.entry.step,
        "family": found.family,
        "size": found.entry.size,
        "digest": found.entry.digest,
        "how": found.how,
        "fell_back": found.fell_back,
        "provenance": provenance_json(found.record.provenance),
        "input": _input(storage, found.record),
    }
    if args.json:
        output.print_json(data)
        return 0
    sys.stdout.write(
        f"{shown(args.spec)}: {shown(url)} (step {found.entry.step}), "
        f"{shown(found.how)}; its record "
        "agrees with HEAD (the payload is hashed when a run fetches it)\n"
    )
    for key, value in provenance_rows(found.record.provenance):
        sys.stdout.write(f"  {key:<12} {value}\n")
    if getattr(args, "with_input", False) and data["input"] is not None:
        sys.stdout.write("input:\n")
        for line in input_text(data["input"]).splitlines():
            sys.stdout.write(shown(line, MAX_LOG_LINE) + "\n")
    return 0


def _present(storage, spec: str):
    """The first candidate whose payload is there at its size (one ``head`` each)."""
    defects: list[str] = []
    for found in candidates(storage, spec, primary(_head(storage))):
        info = storage.head(found.entry.key)
        if info is not None and info.size == found.entry.size:
            return fell_back(found, defects)
        what = "is missing" if info is None else f"holds {info.size} bytes"
        defects.append(
            f"{found.key_url} {what} (its commit record says {found.entry.size})"
        )
        if spec not in LATEST and spec != "best":
            raise RestartNotFoundError(defects[-1])
    raise RestartNotFoundError(
        f"no checkpoint of {storage.url} is there whole: {'; '.join(defects)}"
    )


def _input(storage, record) -> dict | None:
    """The training input a remote record names, from ``inputs/`` of its store."""
    from ..checkpoint.limits import MAX_INPUT_BYTES
    from ..checkpoint.provenance import INPUTS_DIR, input_path, parse_input

    origin = record.provenance
    if origin is None or origin.input is None:
        return None
    key = f"{INPUTS_DIR}/{input_path(Path('.'), origin.input).name}"
    found = storage.get(key, MAX_INPUT_BYTES)
    return None if found is None else parse_input(found[0], origin.input)


# -- inspect ---------------------------------------------------------------------------


def inspect(args: argparse.Namespace) -> int:
    """Fetch a checkpoint (verified) into a cache, then inspect it as a file."""
    from ..storage.local import LocalStorage
    from ..storage.staging import staging_dir
    from .inspect import inspect_file, show

    storage, spec = _split(args.path, None)
    cache = staging_dir(storage.url, purpose="inspected")
    source = RemoteSource(storage, cache, LocalStorage(cache))
    found, path, warnings = fetch_first(storage, spec, primary(_head(storage)), source)
    for warning in warnings:
        sys.stderr.write(f"dp-ckpt: warning: {shown(warning, MAX_LOG_LINE)}\n")
    result = inspect_file(path, digest=args.digest, depth=args.depth)
    result["url"] = storage.url_of(found.entry.key)
    if args.json:
        output.print_json(result)
    else:
        sys.stdout.write(f"{shown(result['url'])} (fetched into {shown(path)})\n")
        show(result)
    return 0 if result["loaded"] and result["record"] in {"ok", "none"} else FAILURE


# -- prune -------------------------------------------------------------------------------


def prune(args: argparse.Namespace) -> int:
    """Apply retention to what HEAD keeps, holding the writer lease."""
    storage = storage_for(args.directory)
    if getattr(args, "release_lease", False):
        return _release(storage, args)
    keep = getattr(args, "keep_last", None)
    if keep is None:
        raise UsageError(
            f"{storage.url}: give --keep-last N (a remote store records no policy of its own)"
        )
    head = _head(storage)
    doomed = {
        prefix: set(
            plan_prune(
                {e.name: e.step for e in state.kept},
                current_step=max((e.step for e in state.kept), default=0),
                protected={state.published.name} if state.published else set(),
                policy=KeepLast(keep),
            )
        )
        for prefix, state in _families(head, getattr(args, "family", None), storage.url)
    }
    gone = [
        (prefix, entry)
        for prefix, names in doomed.items()
        for entry in head.family(prefix).kept
        if entry.name in names
    ]
    if args.dry_run or not gone:
        _report(storage, gone, args, removed=False)
        return 0
    lease = Lease(storage)
    epoch = lease.acquire(min_epoch=head.epoch + 1)
    try:
        swap = heads.update(storage, epoch, _pruned(storage, epoch, head, gone))
        # every key the store named before, and does not now (segments read)
        before = head.referenced()
        after = expand(storage, swap.head).referenced()
        for key in sorted(before - after):
            if owned(key):  # HEAD's entries are of the grammar; checked again
                storage.delete(key)
    finally:
        lease.release()
    _report(storage, gone, args, removed=True)
    return 0


def _pruned(storage, epoch: int, head, gone):
    """The change of HEAD that drops ``gone``: from its entries, and from its
    catalogue segments by writing each touched one anew without them (a
    segment is never rewritten)."""
    doomed = {e.key for _, e in gone}
    swaps, n = [], head.seq + 1
    for prefix, state in head.families.items():
        for top in state.segments:
            entries = [e for _, got in leaves(storage, prefix, top) for e in got]
            if not doomed & {e.key for e in entries}:
                continue
            rest = [e for e in entries if e.key not in doomed]
            new = []
            for at in range(0, len(rest), SPILL):
                new.append(
                    write_segment(storage, epoch, n, prefix, rest[at : at + SPILL])
                )
                n = parse_key(new[-1].key).upload + 1
            swaps.append((prefix, top.key, new))

    def change(current):
        for prefix, entry in gone:
            current = current.without(prefix, [entry.key])
        for prefix, old, new in swaps:
            current = current.resegmented(prefix, [old], new)
        return current

    return change


def _report(storage, gone, args, *, removed: bool) -> None:
    items = [
        {"family": p, "step": e.step, "url": storage.url_of(e.key), "size": e.size}
        for p, e in gone
    ]
    if args.json:
        output.print_json(
            {"store": storage.url, "removed" if removed else "would_remove": items}
        )
        return
    verb = "removed" if removed else "would remove"
    sys.stdout.write(f"{storage.url}: {verb} {len(items)} checkpoint(s)\n")
    for item in items:
        sys.stdout.write(
            f"  {shown(item['family'])} step {item['step']}: {shown(item['url'])}\n"
        )


def _release(storage, args) -> int:
    """Release a lease whose holder is gone (watched up to its time to live)."""
    why = Lease(storage).clear()
    if why is None:
        sys.stdout.write(f"{storage.url}: no lease\n")
    else:
        sys.stdout.write(f"{storage.url}: lease released ({shown(why)})\n")
    return 0
