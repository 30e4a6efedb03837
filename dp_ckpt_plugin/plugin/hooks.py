"""The one door to the plugins: a typed method per hook.

Nothing else in the package calls ``pm.hook``. :class:`Hooks` wraps a
``pluggy`` plugin manager (built by
:func:`~dp_ckpt_plugin.plugin.get_plugin_manager`) and gives each hook a
method with the answer the caller needs: "no plugin answered" (``None``
from a ``firstresult`` hook) becomes a clear error here, once, instead of at
every call site. Observers (``on_commit``) are each called through pluggy, so
hook wrappers and tracing see every call, and one observer that raises is
logged without stopping the others or the save.

What a plugin proposes is not trusted here: a restart a resolver plugin
proposes is verified by the front door
(:func:`~dp_ckpt_plugin.resolution.resolve_restart`) like any other.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pluggy

from ..errors import CheckpointWriteError, ConfigError, CorruptCheckpointError
from ..text import shown

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint, Commit
    from ..formats import FormatInfo
    from ..resolution import ResolveContext, Resolved
    from ..storage.objects import StorageFactory

log = logging.getLogger("dp_ckpt_plugin")

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


class Hooks:
    """Typed calls of every hook of one plugin manager.

    Parameters
    ----------
    pm : pluggy.PluginManager
        The plugin manager; ``Hooks.of`` accepts either.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm

    @classmethod
    def of(cls, pm: pluggy.PluginManager | Hooks) -> Hooks:
        """``pm`` wrapped, or ``pm`` itself when it is a :class:`Hooks` already."""
        return pm if isinstance(pm, Hooks) else cls(pm)

    # -- formats -------------------------------------------------------------
    def formats(self) -> dict[str, FormatInfo]:
        """Every registered format by name (the first registration of a name wins)."""
        found: dict[str, FormatInfo] = {}
        for infos in self.pm.hook.register_formats():
            for info in infos or ():
                found.setdefault(info.name, info)
        return found

    def format(self, name: str) -> FormatInfo:
        """The format called ``name``.

        Raises
        ------
        ConfigError
            Naming the formats there are.
        """
        formats = self.formats()
        try:
            return formats[name]
        except KeyError:
            known = ", ".join(sorted(formats)) or "none"
            raise ConfigError(
                f"unknown checkpoint format {name!r}; available: {known}"
            ) from None

    def format_of_file(self, path: Path) -> str | None:
        """The registered format whose suffix ``path`` has, or ``None``."""
        for name, info in self.formats().items():
            if path.name.endswith(info.suffix):
                return name
        return None

    # -- storages ------------------------------------------------------------------
    def storages(self) -> dict[str, StorageFactory]:
        """Every object storage plugins offer, by scheme (the first offer wins).

        Raises
        ------
        ConfigError
            For an offer whose scheme is not one (``[a-z][a-z0-9+.-]*``) or
            whose factory is not callable.
        """
        found: dict[str, StorageFactory] = {}
        for offered in self.pm.hook.register_storages():
            for scheme, factory in (offered or {}).items():
                if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
                    raise ConfigError(
                        f"a plugin offers a storage for {shown(repr(scheme))}: not a "
                        "URL scheme (lowercase, like 's3')"
                    )
                if not callable(factory):
                    raise ConfigError(
                        f"the storage a plugin offers for {scheme}:// is not callable"
                    )
                found.setdefault(scheme, factory)
        return found

    # -- saving and loading -------------------------------------------------------
    def save_step(self, format: str, step: int, state: Any, file: BinaryIO) -> None:
        """Serialize ``state`` into ``file`` through ``on_save_step``.

        Raises
        ------
        CheckpointWriteError
            When no plugin writes ``format``.
        """
        written = self.pm.hook.on_save_step(
            format=format, step=step, state=state, file=file
        )
        if written is None:
            raise CheckpointWriteError(f"no plugin serialized format {format!r}")

    def serializers(self) -> list[str]:
        """The modules (or classes) of every ``on_save_step`` implementation."""
        return [
            getattr(impl.plugin, "__name__", type(impl.plugin).__qualname__)
            for impl in self.pm.hook.on_save_step.get_hookimpls()
        ]

    def load_step(self, format: str, path: Path, file: BinaryIO | None = None) -> Any:
        """Read a payload through ``on_load_step``, from ``file`` (the verified bytes of ``path``).

        Raises
        ------
        CorruptCheckpointError
            When no plugin reads ``format``.
        """
        state = self.pm.hook.on_load_step(format=format, path=path, file=file)
        if state is None:
            raise CorruptCheckpointError(
                f"no plugin reads format {format!r} (checkpoint {path})"
            )
        return state

    # -- observing ----------------------------------------------------------------
    def commit(self, commit: Commit) -> None:
        """Call every ``on_commit`` observer with ``commit``, each through pluggy.

        One that raises is logged as a warning naming the plugin and the
        checkpoint; the others are still called.
        """
        hook = self.pm.hook.on_commit
        impls = hook.get_hookimpls()
        observers = [i for i in impls if not (i.wrapper or i.hookwrapper)]
        for impl in reversed(observers):  # pluggy's order: last registered first
            others = [o.plugin for o in observers if o is not impl]
            caller = self.pm.subset_hook_caller("on_commit", others) if others else hook
            try:
                caller(commit=commit, checkpoint=commit.checkpoint)
            except Exception as exc:
                log.warning(
                    "on_commit observer %r failed for %s: %s: %s",
                    impl.plugin_name,
                    commit.checkpoint.path,
                    type(exc).__name__,
                    exc,
                )

    # -- restarts and freezing --------------------------------------------------------
    def propose_restart(self, spec: str, context: ResolveContext) -> Resolved | None:
        """What the first resolver that knows ``spec`` proposes, or ``None``.

        The proposal is not verified here: the front door does that.
        """
        return self.pm.hook.on_resolve_restart(spec=spec, context=context)

    def freeze(self, checkpoint: Checkpoint, output: str, options: dict) -> str:
        """Freeze ``checkpoint`` through the first ``on_freeze`` that answers.

        Raises
        ------
        ConfigError
            When no plugin freezes checkpoints of ``options["host"]``.
        """
        frozen = self.pm.hook.on_freeze(
            checkpoint=checkpoint, output=output, options=options
        )
        if frozen is None:
            raise ConfigError(
                f"no plugin freezes checkpoints of {options.get('host', 'this host')!r}"
            )
        return frozen
