"""What a writer cleans up when it takes a remote store: the only listing.

Writers that died (killed, preempted, cut off) may leave behind payloads and
records no HEAD names (an upload that never reached its swap, a deletion
that failed) and, on S3, incomplete multipart uploads, which are invisible
and billed. Once a new writer holds the lease and has fenced HEAD, nothing
of an older epoch can become named again (every writer names only what it
wrote under its own epoch, and an older writer can no longer swap HEAD), so
:func:`recover` removes, under the folders of older epochs, exactly the
objects that neither HEAD nor an archive it lists names, and aborts the
incomplete uploads there. It runs on the uploader thread, so the run's start
does not wait for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..errors import CheckpointError
from ..storage.objects import ObjectStorage, StorageUnavailableError
from .head import MAX_HEAD_BYTES, Head
from .keys import PROBE_PREFIX, epoch_of

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

    ``None`` when an archive cannot be read (then nothing may be removed).
    """
    keys = head.referenced()
    for archive in head.archives:
        found = storage.get(archive, MAX_HEAD_BYTES)
        if found is None:
            continue
        try:
            keys |= Head.parse(found[0], storage.url_of(archive)).referenced()
        except CheckpointError:
            log.warning(
                "%s is unreadable: what it names is kept anyway",
                storage.url_of(archive),
            )
            return None  # nothing is removed when an archive cannot be read
    return keys


def recover(storage: ObjectStorage, head: Head, epoch: int) -> Recovered:
    """Remove what dead writers of epochs below ``epoch`` left (see the module docs)."""
    done = Recovered()
    keep = named(storage, head)
    if keep is None:
        return done
    now = time.time()
    for info in list(storage.list("")):
        written = epoch_of(info.key)
        stale_probe = (
            info.key.startswith(PROBE_PREFIX) and now - info.modified > PROBE_AGE
        )
        if not stale_probe and (written is None or written >= epoch):
            continue
        if info.key in keep:
            continue
        if storage.delete(info.key):
            done.objects += 1
            done.bytes += info.size
    if getattr(storage, "aborts_uploads", False):
        try:
            done.uploads = storage.abort_incomplete_uploads("e", 0.0)
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
