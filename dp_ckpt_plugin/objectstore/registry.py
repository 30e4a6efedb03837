"""One registry from URL scheme to storage.

:func:`storage_for` is the one place a storage is chosen for a location:

=====================================  =========================================
``s3://``, ``gs://``, ``az://``,        :class:`~dp_ckpt_plugin.objectstore.cloud.CloudStorage`
``abfs://``, ``abfss://``               (needs ``pip install "dp-ckpt-plugin[s3]"``)
=====================================  =========================================

Another storage is added by :func:`register` (``register("myfs", factory)``)
or, from an installed package, through the ``dp_ckpt.storage`` entry-point
group: the entry point's name is the scheme and its value a factory
``callable(url, **options)`` returning an
:class:`~dp_ckpt_plugin.storage.objects.ObjectStorage`::

    [project.entry-points."dp_ckpt.storage"]
    myfs = "my_package.storage:MyStorage"

Entry points are read the first time a scheme is not known, and loaded one
at a time, when their scheme is asked for; they cannot replace a built-in
scheme (:func:`register` with ``replace=True`` can). A scheme named in
``DP_CKPT_DISABLE_PLUGINS`` is not loaded from an entry point.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from importlib import metadata
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from ..storage.forks import in_child
from ..storage.objects import ObjectStorage
from ..text import shown

#: Entry-point group third-party storages register under (name = scheme).
ENTRY_POINT_GROUP = "dp_ckpt.storage"

Factory = Callable[..., ObjectStorage]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
#: A scheme and a colon followed by one slash or none (``s3:/bucket``).
_NEAR_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/?(?!/)(.*)", re.DOTALL)
_VALID_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def _cloud(url: str, **options) -> ObjectStorage:
    from .cloud import CloudStorage

    return CloudStorage(url, **options)


#: The schemes this package serves itself.
BUILTIN: dict[str, Factory] = {
    "s3": _cloud,
    "gs": _cloud,
    "az": _cloud,
    "abfs": _cloud,
    "abfss": _cloud,
}

_factories: dict[str, Factory] = dict(BUILTIN)
_entry_points: dict[str, metadata.EntryPoint] | None = None
_lock = threading.Lock()


@in_child
def _forked() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


def scheme_of(text: str | os.PathLike) -> str:
    """The scheme of a URL in lower case (``s3``), or ``""`` for a plain path."""
    if isinstance(text, os.PathLike):
        return ""
    found = _SCHEME.match(text)
    return found.group(1).lower() if found else ""


def local_path(text: str | os.PathLike) -> str | None:
    """The local path a location names, or ``None`` for an object store's URL.

    The one parser of a ``save_dir``, a store argument or a storage's URL: a
    plain path is itself, spaces kept (``file:x`` too: without ``//`` it is
    no URL); a URL's scheme is read past surrounding spaces;
    ``file:///x`` and ``file://localhost/x`` are ``/x``, percent-escapes
    decoded.

    Raises
    ------
    ConfigError
        In one line, for a file URL naming another host, a query, a fragment,
        a control character or no path.
    """
    if not isinstance(text, str):
        return os.fspath(text)
    scheme = scheme_of(text.strip())
    if not scheme:
        return text
    if scheme != "file":
        return None
    if any(not c.isprintable() for c in text):
        raise ConfigError(
            f"{shown(text)}: a URL holds no control character (a newline, a tab, "
            "an escape)"
        )
    parts = urlsplit(text.strip())
    if parts.netloc.lower() not in ("", "localhost") or parts.query or parts.fragment:
        raise ConfigError(
            f"{shown(text)}: a file URL names a path of this machine (file:///path), "
            "with no host, query or fragment"
        )
    if not parts.path:
        raise ConfigError(f"{shown(text)}: a file URL names a path (file:///path)")
    return unquote(parts.path)


def check_not_mistyped(text: str | os.PathLike) -> None:
    """Refuse a path that is a mistyped URL of an object store (``s3:/bucket/run``).

    A scheme some storage serves (not ``file``), a colon and one slash or
    none would otherwise be a local folder named ``s3:``.

    Raises
    ------
    ConfigError
        In one line: ``did you mean s3://bucket/run``.
    """
    if isinstance(text, os.PathLike) or not isinstance(text, str):
        return
    found = _NEAR_URL.fullmatch(text.strip())
    if found is None or scheme_of(text.strip()):
        return
    scheme = found.group(1).lower()
    if scheme == "file" or scheme not in known_schemes():
        return
    meant = f"{scheme}://{found.group(2).lstrip('/') or 'BUCKET/PREFIX'}"
    raise ConfigError(
        f"{text}: not a local path nor an object-store URL; did you mean {meant}"
    )


def register(scheme: str, factory: Factory, *, replace: bool = False) -> None:
    """Serve ``scheme://`` URLs with ``factory(url, **options)``.

    Raises
    ------
    ValueError
        For a scheme that is not one (``[a-z][a-z0-9+.-]*``), or one already
        served, unless ``replace``.
    """
    if not isinstance(scheme, str) or not _VALID_SCHEME.fullmatch(scheme):
        raise ValueError(f"not a URL scheme: {scheme!r} (lowercase, like 's3')")
    if not callable(factory):
        raise ValueError(f"the storage factory for {scheme!r} is not callable")
    with _lock:
        if scheme in _factories and not replace:
            raise ValueError(f"the scheme {scheme!r} already has a storage")
        _factories[scheme] = factory


def unregister(scheme: str) -> None:
    """Stop serving ``scheme`` (a built-in one comes back as it was)."""
    with _lock:
        if scheme in BUILTIN:
            _factories[scheme] = BUILTIN[scheme]
        else:
            _factories.pop(scheme, None)


def _installed() -> dict[str, metadata.EntryPoint]:
    """The entry points of the group, by scheme, read once (not loaded)."""
    global _entry_points
    if _entry_points is None:
        from ..blocklist import blocked_names

        blocked = set(blocked_names())
        found = metadata.entry_points(group=ENTRY_POINT_GROUP)
        _entry_points = {ep.name: ep for ep in found if ep.name not in blocked}
    return _entry_points


def _factory(scheme: str) -> Factory | None:
    with _lock:
        found = _factories.get(scheme)
        if found is not None:
            return found
        ep = _installed().get(scheme)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except Exception as exc:
            raise ConfigError(
                f"the storage for {scheme}:// ({ep.value}) could not be loaded: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not callable(loaded):
            raise ConfigError(
                f"the storage for {scheme}:// ({ep.value}) is not a callable factory"
            )
        _factories[scheme] = loaded
        return loaded


def known_schemes() -> list[str]:
    """Every scheme served: built-in, registered and installed."""
    with _lock:
        return sorted({*_factories, *_installed()})


def storage_for(url_or_path: str | os.PathLike, **options) -> ObjectStorage:
    """The object storage of a URL whose scheme is known.

    Raises
    ------
    ConfigError
        In one line, for a local path or ``file://`` URL (a directory store,
        not an object storage), a scheme no storage serves (listing the known
        ones) or a URL its storage refuses.
    """
    check_not_mistyped(url_or_path)
    if local_path(url_or_path) is not None:
        raise ConfigError(
            f"{shown(os.fspath(url_or_path))}: a local path is a directory store, "
            "not an object storage"
        )
    if any(not c.isprintable() for c in url_or_path):
        raise ConfigError(
            f"{shown(url_or_path)}: a URL holds no control character (a "
            "newline, a tab, an escape)"
        )
    url_or_path = url_or_path.strip()
    scheme = scheme_of(url_or_path)
    factory = _factory(scheme)
    if factory is None:
        known = ", ".join(f"{s}://" for s in known_schemes())
        raise ConfigError(
            f"{url_or_path}: no storage serves {scheme}:// (known: {known}; or "
            "give a local path)"
        )
    return factory(url_or_path, **options)


def remote_url(text: str) -> str:
    """``text`` as the URL of a store on object storage, normalized.

    Only the form is checked (a scheme some storage serves other than
    ``file``, a bucket); nothing is contacted.

    Raises
    ------
    ValueError
        Saying what is wrong, in one line.
    """
    scheme = scheme_of(text)
    if not scheme or scheme == "file":
        raise ValueError("it is not the URL of an object store")
    if any(not c.isprintable() for c in text):
        raise ValueError(
            "an object-store URL holds no control character (a newline, a tab, "
            "an escape)"
        )
    if _factory(scheme) is None:
        known = ", ".join(f"{s}://" for s in known_schemes())
        raise ValueError(
            f"no storage serves {scheme}:// (known: {known}; or give a local path)"
        )
    bucket, _, prefix = text.split("://", 1)[1].partition("/")
    if not bucket:
        raise ValueError(f"the URL names no bucket ({scheme}://bucket/run)")
    prefix = prefix.strip("/")
    return f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"
