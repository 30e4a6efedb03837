"""One registry from URL scheme to object storage.

:func:`storage_for` is the one place a storage is chosen for a URL:

=====================================  =========================================
``s3://``, ``gs://``, ``az://``,        ``objectstore.cloud.CloudStorage``
``abfs://``, ``abfss://``               (needs ``pip install "dp-ckpt-plugin[s3]"``)
=====================================  =========================================

Another scheme is offered by a plugin, through the ``register_storages``
hook (``docs/hooks.md``), asked of the process's plugin manager
(:func:`plugin_manager`: the ``dp_ckpt`` entry-point group, less what
``DP_CKPT_DISABLE_PLUGINS`` blocks), built the first time a scheme is not
a built-in one. A plugin cannot replace a built-in scheme. A plain path or a
``file://`` URL is a directory store (:func:`local_path`), never an object
storage.
"""

from __future__ import annotations

import os
import re
import threading
from urllib.parse import unquote, urlsplit

import pluggy

from ..errors import ConfigError
from ..plugin import get_plugin_manager
from ..plugin.hooks import Hooks
from ..storage.forks import in_child
from ..storage.objects import ObjectStorage, StorageFactory
from ..text import shown

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
#: A scheme and a colon followed by one slash or none (``s3:/bucket``).
_NEAR_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):/?(?!/)(.*)", re.DOTALL)


def _cloud(url: str, **options) -> ObjectStorage:
    from .cloud import CloudStorage

    return CloudStorage(url, **options)


#: The schemes this package serves itself.
BUILTIN: dict[str, StorageFactory] = dict.fromkeys(
    ("s3", "gs", "az", "abfs", "abfss"), _cloud
)

_plugins: pluggy.PluginManager | None = None
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
    _check_printable(text)
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
    if scheme == "file" or (scheme not in BUILTIN and scheme not in _offered()):
        return
    meant = f"{scheme}://{found.group(2).lstrip('/') or 'BUCKET/PREFIX'}"
    raise ConfigError(
        f"{text}: not a local path nor an object-store URL; did you mean {meant}"
    )


def plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager the storages of other schemes come from.

    Built once, on first use, by
    :func:`~dp_ckpt_plugin.plugin.get_plugin_manager`; a plugin registered
    on it (``plugin_manager().register(plugin)``) offers its storages from
    then on.

    Raises
    ------
    ConfigError
        In one line, when an installed plugin cannot be loaded.
    """
    global _plugins
    with _lock:
        if _plugins is None:
            try:
                _plugins = get_plugin_manager()
            except Exception as exc:
                raise ConfigError(
                    "the plugins offering storages could not be loaded: "
                    f"{type(exc).__name__}: {shown(str(exc))}"
                ) from None
        return _plugins


def _offered() -> dict[str, StorageFactory]:
    """The storages plugins offer, by scheme, less the built-in and ``file``."""
    offered = Hooks(plugin_manager()).storages()
    return {k: f for k, f in offered.items() if k not in BUILTIN and k != "file"}


def _factory(scheme: str) -> StorageFactory | None:
    return BUILTIN.get(scheme) or _offered().get(scheme)


def known_schemes() -> list[str]:
    """Every scheme served: built-in, and offered by a plugin."""
    return sorted({*BUILTIN, *_offered()})


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
    _check_printable(url_or_path)
    url_or_path = url_or_path.strip()
    scheme = scheme_of(url_or_path)
    factory = _factory(scheme)
    if factory is None:
        raise ConfigError(f"{url_or_path}: {_unserved(scheme)}")
    return factory(url_or_path, **options)


def _check_printable(text: str) -> None:
    """Refuse a URL holding a control character, in one line."""
    if any(not c.isprintable() for c in text):
        raise ConfigError(
            f"{shown(text)}: a URL holds no control character (a newline, a tab, "
            "an escape)"
        )


def _unserved(scheme: str) -> str:
    known = ", ".join(f"{s}://" for s in known_schemes())
    return f"no storage serves {scheme}:// (known: {known}; or give a local path)"


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
        raise ValueError(_unserved(scheme))
    bucket, _, prefix = text.split("://", 1)[1].partition("/")
    if not bucket:
        raise ValueError(f"the URL names no bucket ({scheme}://bucket/run)")
    prefix = prefix.strip("/")
    return f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"
