"""Where a remote store is staged on this node, and why nobody else can reach it.

A run whose ``save_dir`` is a remote store commits each checkpoint into a
local staging directory first. It is node-local by default (under the job's
or the system's temporary directory, ``$TMPDIR`` or ``/tmp``, one folder per
user, then one per store URL), because the nodes of such a run share no file
system and home directories on clusters are small; ``DP_CKPT_STAGING`` (or
the ``staging_dir`` option) puts it elsewhere, a fast local disk say.

What is staged is uploaded and published for every node, so the staging
root is private, checked on every start (:func:`private_dir`): the root and
every folder below it down to the staging directory is a directory, not a
link, owned by this user, with no permission for the group or others (mode
0700; a missing one is made so); every folder above the root is owned by
this user or by root and, when others may write it, has the sticky bit (as
``/tmp`` has), so nobody can swap the root for another. A root that fails
is refused in one line naming it and what is wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from ..errors import ConfigError

#: Environment variable naming the folder staging directories go in.
STAGING_ENV = "DP_CKPT_STAGING"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def staging_root() -> Path:
    """The folder this node's staging directories go in (not checked here)."""
    chosen = os.environ.get(STAGING_ENV)
    if chosen:
        return Path(os.path.abspath(chosen))
    return Path(tempfile.gettempdir()) / f"dp_ckpt-{os.geteuid()}"


def staging_path(
    url: str, *, base: Path | None = None, purpose: str = "staging"
) -> Path:
    """The staging directory of the store at ``url``, as a path (nothing checked)."""
    slug = _UNSAFE.sub("_", url.split("://", 1)[-1]).strip("._")[-80:] or "store"
    tag = hashlib.sha256(url.encode("utf-8")).hexdigest()[:8]
    return (base or staging_root()) / purpose / f"{slug}-{tag}"


def staging_dir(
    url: str, *, base: Path | None = None, purpose: str = "staging"
) -> Path:
    """The staging directory of the store at ``url`` (``purpose``: what it holds).

    Made if missing; it and its root are checked by :func:`private_dir`.

    Raises
    ------
    ConfigError
        In one line naming the folder that is not private, and why.
    """
    root = Path(os.path.abspath(base)) if base is not None else staging_root()
    path = staging_path(url, base=root, purpose=purpose)
    private_dir(root, path)
    return path


def _refuse(path: Path, why: str, root: Path) -> ConfigError:
    return ConfigError(
        f"staging folder {path} {why}: the staging root {root} and every folder "
        f"in it must be this user's own (mode 0700, no link); fix it or set "
        f"{STAGING_ENV} to a private folder"
    )


def _check_above(root: Path, uid: int) -> None:
    """Nobody but this user and root can replace ``root`` or a folder above it."""
    for folder in reversed(root.parents):
        if not os.path.lexists(folder):
            return  # made below, by this user, mode 0700
        try:
            found = os.stat(folder)
        except OSError as exc:
            raise _refuse(folder, f"cannot be read ({exc.strerror})", root) from None
        if not stat.S_ISDIR(found.st_mode):
            raise _refuse(folder, "is not a directory", root)
        if found.st_uid not in (uid, 0):
            raise _refuse(folder, f"belongs to user {found.st_uid}", root)
        shared = found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if shared and not found.st_mode & stat.S_ISVTX:
            raise _refuse(
                folder, "may be written by others and has no sticky bit", root
            )


def _check_own(folder: Path, uid: int, root: Path) -> None:
    """``folder`` is a directory of this user's, mode 0700, not a link; made if missing."""
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # another rank or run made it first: checked below
        except OSError as exc:
            raise _refuse(folder, f"cannot be made ({exc.strerror})", root) from None
        found = os.lstat(folder)
    except OSError as exc:
        raise _refuse(folder, f"cannot be read ({exc.strerror})", root) from None
    if stat.S_ISLNK(found.st_mode):
        raise _refuse(folder, "is a link", root)
    if not stat.S_ISDIR(found.st_mode):
        raise _refuse(folder, "is not a directory", root)
    if found.st_uid != uid:
        raise _refuse(
            folder, f"belongs to user {found.st_uid}, not to {uid} (this user)", root
        )
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077:
        raise _refuse(
            folder, f"has mode {mode:04o} (the group or others may use it)", root
        )


def private_dir(root: Path, path: Path) -> None:
    """Check (making what is missing, mode 0700) ``root`` and each folder to ``path``.

    ``path`` lies in ``root``. See the module docs for what is checked.

    Raises
    ------
    ConfigError
        In one line naming the first folder that fails, and why.
    """
    uid = os.geteuid()
    root, path = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    if root != path and root not in path.parents:
        raise ValueError(f"{path} is not in {root}")
    _check_above(root, uid)
    missing = [p for p in root.parents if not os.path.lexists(p)]
    levels = [*reversed(missing), root]
    levels += reversed([p for p in path.parents if root in p.parents])
    if path != root:
        levels.append(path)
    for folder in levels:
        _check_own(folder, uid, root)
