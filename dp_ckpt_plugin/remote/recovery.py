"""What a writer cleans up when it takes a remote store: the only listing.

Writers that died (killed, preempted, cut off) may leave behind payloads and
records no HEAD names (an upload that never reached its swap, a deletion
that failed) and, on S3, incomplete multipart uploads, which are invisible
and billed. Once a new writer holds the lease and has fenced HEAD, nothing
of an older epoch can become named again (every writer names only what it
wrote under its own epoch, and an older writer can no longer swap HEAD), so
:func:`recover` lists the folders of ``U``'s own older epochs
(``U/e<epoch>/``, epoch below the writer's) and nothing else, and removes
there exactly the payloads and records of the store's key grammar
(:func:`~dp_ckpt_plugin.remote.keys.parse_key`) that neither HEAD nor an
archive it lists names (their catalogue segments read), and, under
``U/catalogue/``, the segments of older epochs nothing names. Anything else there (a nested store, a user's
object) is not ours and stays. Of the incomplete uploads, only those whose
key is a payload or record of an older epoch and that began before this
writer took the lease are aborted. It runs on the uploader thread, so the
run's start does not wait for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import CheckpointError
from ..storage.objects import (
    AbortsUploads,
    ListsFolders,
    ObjectInfo,
    ObjectStorage,
    StorageUnavailableError,
)
from .catalogue import expand
from .head import MAX_HEAD_BYTES, Head
from .keys import (
    PAYLOAD,
    PROBE,
    PROBE_PREFIX,
    RECORD,
    SEGMENT,
    SEGMENT_PREFIX,
    parse_epoch_dir,
    parse_key,
)

log = logging.getLogger("dp_ckpt_plugin")

#: A probe object older than this is a leftover of a killed probe.
PROBE_AGE = 3600.0


@dataclass
class Recovered:
    """What :func:`recover` removed."""

    objects: int = 0
    bytes: int = 0
    uploads: int = 0


def named(storage: ObjectStorage, head: Head) -> set[str] | None:
    """Every key HEAD names and every key an archive it lists names.

    Their catalogue segments' entries included. ``None`` when an archive or
    a segment cannot be read (then nothing may be removed).
    """
    try:
        keys = expand(storage, head).referenced()
    except CheckpointError as exc:
        log.warning("%s: what HEAD names is kept anyway", exc)
        return None
    for archive in head.archives:
        found = storage.get(archive, MAX_HEAD_BYTES)
        if found is None:
            continue
        try:
            archived = Head.parse(found[0], storage.url_of(archive))
            keys |= expand(storage, archived).referenced()
        except CheckpointError:
            log.warning(
                "%s is unreadable: what it names is kept anyway",
                storage.url_of(archive),
            )
            return None  # nothing is removed when an archive cannot be read
    return keys


def older_epochs(storage: ObjectStorage, epoch: int) -> list[str]:
    """The folders ``e<epoch>`` of ``U`` for epochs below ``epoch``, by one listing."""
    if isinstance(storage, ListsFolders):
        names = storage.folders("")
    else:
        names = {i.key.partition("/")[0] for i in storage.list("e") if "/" in i.key}
    return sorted(
        n for n in names if (found := parse_epoch_dir(n)) is not None and found < epoch
    )


def leftovers(storage: ObjectStorage, head: Head, epoch: int):
    """The objects of older epochs of ``U`` that are ours and nothing names.

    ``None`` when an archive of HEAD cannot be read (then nothing may go).
    """
    keep = named(storage, head)
    if keep is None:
        return None
    now = time.time()

    def leftover(info: ObjectInfo) -> bool:
        key = parse_key(info.key)
        if key is None:  # not ours: a nested store, a user's object
            return False
        if key.kind == PROBE:
            return now - info.modified > PROBE_AGE
        ours = key.kind in (PAYLOAD, RECORD, SEGMENT)
        return ours and key.epoch < epoch and key.text not in keep

    folders = [f"{folder}/" for folder in older_epochs(storage, epoch)]
    listed = [*folders, SEGMENT_PREFIX, PROBE_PREFIX]
    return [i for prefix in listed for i in storage.list(prefix) if leftover(i)]


def recover(
    storage: ObjectStorage,
    head: Head,
    epoch: int,
    *,
    held_for: Callable[[], float] | None = None,
) -> Recovered:
    """Remove what dead writers of epochs below ``epoch`` left (see the module docs).

    ``held_for()`` says how many seconds ago this writer took the lease: only
    uploads that began before that are aborted (none without it).
    """
    done = Recovered()
    found = leftovers(storage, head, epoch)
    if found is None:
        return done
    for info in found:
        if storage.delete(info.key):
            done.objects += 1
            done.bytes += info.size
    if held_for is not None and isinstance(storage, AbortsUploads):
        try:
            done.uploads = _abort(storage, epoch, held_for)
        except StorageUnavailableError as exc:
            log.warning("%s", exc)
    if done.objects or done.uploads:
        log.info(
            "%s: removed %d object(s) (%.1f MB) and %d incomplete upload(s) that "
            "writers before epoch %d left and nothing names",
            storage.url,
            done.objects,
            done.bytes / 1e6,
            done.uploads,
            epoch,
        )
    return done


def _abort(storage: AbortsUploads, epoch: int, held_for: Callable[[], float]) -> int:
    """Abort the older epochs' uploads of ``U`` begun before the lease was taken."""
    if not storage.aborts_uploads:
        return 0
    uploads, server_now = storage.incomplete_uploads("e")
    # the takeover by the server's clock, never later than it really was
    before = server_now - held_for()
    aborted = 0
    for upload in uploads:
        key = parse_key(upload.key)
        if key is None or key.kind not in (PAYLOAD, RECORD) or key.epoch >= epoch:
            continue
        if upload.initiated < before:
            aborted += storage.abort_upload(upload)
    return aborted
