"""One registry from URL scheme to storage (placeholder until the full one lands)."""

from __future__ import annotations

import re

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
REMOTE_SCHEMES = ("s3", "gs", "az", "memory")


def scheme_of(text: str) -> str | None:
    head, sep, _ = text.partition("://")
    return head.lower() if sep else None


def remote_url(text: str) -> str:
    scheme = scheme_of(text)
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(
            f"dp_ckpt_plugin cannot store checkpoints at a {scheme}:// URL "
            f"(it can at {', '.join(s + '://' for s in REMOTE_SCHEMES)} and local paths)"
        )
    bucket, _, prefix = text.split("://", 1)[1].partition("/")
    if not bucket:
        raise ValueError("the URL names no bucket (s3://bucket/run)")
    return f"{scheme}://{bucket}/{prefix.strip('/')}".rstrip("/")


def storage_for(url: str, **options):
    scheme = scheme_of(url)
    if scheme == "memory":
        from .memory import MemoryStorage

        return MemoryStorage(url)
    from .cloud import CloudStorage

    return CloudStorage(url, **options)
