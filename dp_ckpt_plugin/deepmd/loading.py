"""deepmd-kit loads the bytes the front door verified, not the path again.

A command that loads a checkpoint (``dp train --restart``, ``--init-model``,
``--finetune``, ``dp freeze -c``, ``dp change-bias``) resolves it through the
front door, which opens the file once, reads it once and verifies those bytes
against the commit record (:attr:`~dp_ckpt_plugin.resolution.Resolved.payload`).
deepmd-kit is then handed the path, and loads it with ``torch.load`` where it
needs it: the trainer's constructor, its fine-tuning rules, the freezer's
tester, ``change-bias``. While :class:`ServedPayloads` serves, a
``torch.load`` of one of its paths reads the held bytes instead of the file;
every other ``torch.load`` goes to torch as it is. So the file is read once,
every loader (deepmd-kit's and the plugin's own: the exact-resume entry, the
heads of a multi-task checkpoint) reads the same verified bytes, and a file
replaced at the path after it was verified is never loaded.

The bytes are given up when the training loop starts (the trainer is built
by then) or when the command ends.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from ..storage import PayloadBytes, default_storage

#: What :meth:`ServedPayloads.kept` gives for a path nothing was served for.
MISSING = object()


def _key(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


class ServedPayloads:
    """The verified bytes of the checkpoints a command loads, by path.

    Parameters
    ----------
    payloads : iterable of PayloadBytes or None
        The bytes to serve (``None`` entries are skipped).
    keep : iterable of str
        Keys of a served payload to keep once deepmd-kit loaded it
        (:meth:`kept`): the plugin's own entry, read then from deepmd-kit's
        load instead of a load of its own.
    """

    def __init__(
        self, payloads: Iterable[PayloadBytes | None] = (), *, keep: Iterable[str] = ()
    ) -> None:
        self.keep = tuple(keep)
        self._held: dict[str, PayloadBytes] = {}
        self._kept: dict[str, dict[str, Any]] = {}
        #: How many ``torch.load`` calls each path was served from its bytes.
        self.served: Counter[str] = Counter()
        self._real: Any = None
        self._guard = threading.Lock()
        for payload in payloads:
            self.add(payload)

    def add(self, payload: PayloadBytes | None) -> None:
        """Hold ``payload`` for loads of its path."""
        if payload is not None:
            self._held[_key(payload.path)] = payload

    def get(self, path: str | os.PathLike) -> PayloadBytes | None:
        """The bytes held for ``path``, or ``None``."""
        return self._held.get(_key(path))

    def kept(self, path: str | os.PathLike, key: str, default: Any = None) -> Any:
        """The value at ``key`` of what the first served load of ``path`` gave.

        ``default`` when nothing was served, the key was not kept, or the
        payload was no dict; :data:`MISSING` distinguishes "not served" from
        a payload without the key (``None``).
        """
        return self._kept.get(_key(path), {}).get(key, default)

    def file(self, path: str | os.PathLike) -> BinaryIO:
        """A file object over the bytes of ``path``: those held, else read once now."""
        held = self.get(path)
        if held is None:
            held = default_storage().read_payload(Path(_key(path)))
        return held.reader()

    # -- serving deepmd-kit's torch.load -------------------------------------------
    def start(self) -> None:
        """Serve every ``torch.load`` of a held path from its bytes (until :meth:`stop`)."""
        import torch

        with self._guard:
            if self._real is not None or not self._held:
                return
            self._real = torch.load
            torch.load = self._load

    def stop(self) -> None:
        """Stop serving and give the bytes up (idempotent)."""
        with self._guard:
            if self._real is not None:
                import torch

                if torch.load == self._load:  # the same method of this object
                    torch.load = self._real
                self._real = None
            self._held.clear()
            self._kept.clear()

    def __enter__(self) -> ServedPayloads:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _load(self, f: Any, *args: Any, **kwargs: Any) -> Any:
        """``torch.load``, reading a held path's bytes in place of the file."""
        real = self._real
        key = _key(f) if isinstance(f, str | os.PathLike) else None
        held = self._held.get(key) if key is not None else None
        if held is None or real is None:
            return (real or _torch_load())(f, *args, **kwargs)
        kwargs.pop("mmap", None)  # bytes in memory are not mapped
        self.served[key] += 1
        loaded = real(held.reader(), *args, **kwargs)
        if self.keep and key not in self._kept:
            found = loaded if isinstance(loaded, dict) else {}
            self._kept[key] = {k: found.get(k) for k in self.keep}
        return loaded


def _torch_load():
    """torch's own ``load`` (a reference kept past :meth:`ServedPayloads.stop`)."""
    from torch.serialization import load

    return load
