"""What a ``dp`` training run needs to know before deepmd-kit builds anything.

The training input is read once, early (a JSON or YAML file, as deepmd-kit reads
it), to validate ``training.save_dir`` and ``training._dp_ckpt`` and to learn
the checkpoint prefix, so that a bad configuration or restart handle fails in
seconds rather than after the data and model are built.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.layout import Family
from ..errors import ConfigError
from ..resolution import ResolveContext
from ..retention import KeepLast
from ..storage import entry_or_none
from ..store.core import FamilyConfig
from ..store.publish import Mirror
from .argcheck import PluginOptions, check_save_dir, plugin_options
from .naming import ema_family

log = logging.getLogger("dp_ckpt_plugin")

#: deepmd-kit's latest pointer in the working directory.
WORKDIR_POINTER = "checkpoint"


@dataclass
class RunSettings:
    """The checkpoint-related part of a training input.

    Attributes
    ----------
    save_dir : Path or None
        ``training.save_dir``.
    save_ckpt : Path
        ``training.save_ckpt`` (the prefix, possibly with a directory).
    options : PluginOptions
        The validated ``training._dp_ckpt`` section.
    training : dict
        The raw ``training`` section (retention keys are read from it).
    cwd : Path
        The working directory of the run.
    suffix : str
        The suffix of the host's checkpoints (its descriptor's).
    save_url : str or None
        ``training.save_dir`` when it names a store on object storage; then
        ``save_dir`` is the local staging directory of that store.
    """

    save_dir: Path | None
    save_ckpt: Path
    options: PluginOptions
    training: dict[str, Any] = field(default_factory=dict)
    cwd: Path = field(default_factory=Path.cwd)
    suffix: str = ".pt"
    save_url: str | None = None

    @property
    def family(self) -> Family:
        """The periodic family (the one ``latest`` means)."""
        return Family(self.save_ckpt.name, self.suffix)

    @property
    def prefix_dir(self) -> Path:
        """The directory of the ``save_ckpt`` prefix, where deepmd-kit puts its alias."""
        return Path(os.path.normpath(self.cwd / self.save_ckpt.parent))

    def family_configs(self) -> list[FamilyConfig]:
        """The periodic and EMA families of the store, with deepmd-kit's files as mirrors.

        Retention windows are set by the trainer once the run length is known.
        """
        family = self.family
        ema = ema_family(family)
        mirrors: tuple[Mirror, ...] = ()
        ema_mirrors: tuple[Mirror, ...] = ()
        if self.options.compat_links:
            mirrors = (
                Mirror(self.cwd / WORKDIR_POINTER, "pointer"),
                Mirror(self.prefix_dir / family.alias, "alias"),
            )
            ema_mirrors = (Mirror(self.prefix_dir / ema.alias, "alias"),)
        return [
            FamilyConfig(family, KeepLast(5), mirrors=mirrors),
            FamilyConfig(ema, KeepLast(5), mirrors=ema_mirrors),
        ]

    def resolve_context(self) -> ResolveContext:
        """Where the chief's ``--restart``/``--init-model`` look, and how strictly.

        The checkpoint is loaded (by deepmd-kit's trainer): its bytes are
        kept from the one reading that verifies them. With a store,
        deepmd-kit's working-directory pointer is where ``latest`` looks last
        (a ``save_dir`` plain deepmd-kit wrote has its pointer there).
        """
        pointers = (self.cwd / WORKDIR_POINTER,) if self.save_dir is not None else ()
        return ResolveContext(
            family=self.family,
            store_dir=self.save_dir,
            cwd=self.cwd,
            prefix_path=self.save_ckpt,
            fallback_pointers=pointers,
            digest=self.options.verify != "size",
            quarantine=self.options.quarantine,
            load=True,
        )


def read_settings(
    config: dict[str, Any], *, suffix: str, cwd: Path | None = None
) -> RunSettings:
    """Validate and take out the plugin's part of a loaded training input.

    Raises
    ------
    ConfigError
        Naming the key and what is wrong.
    """
    if not isinstance(config, dict):
        raise ConfigError("the training input must be a mapping of sections")
    options = plugin_options(config)
    training = config.get("training")
    if not isinstance(training, dict):
        raise ConfigError(
            "the training input has no `training` section (a mapping is required)"
        )
    save_dir = check_save_dir(training.get("save_dir"))
    save_url = None
    if isinstance(save_dir, str):  # a store on object storage: staged here
        from ..storage.staging import staging_dir

        save_url = save_dir
        chosen = options.remote.get("staging_dir")
        base = Path(os.path.abspath(chosen)) if chosen else None
        save_dir = staging_dir(save_url, base=base)
    save_ckpt = training.get("save_ckpt", "model.ckpt")
    if (
        not isinstance(save_ckpt, str)
        or not save_ckpt.strip()
        or save_ckpt.endswith(("/", "\\"))
    ):
        raise ConfigError(
            f"training.save_ckpt must name a file prefix such as 'model.ckpt', got {save_ckpt!r}"
        )
    return RunSettings(
        save_dir=Path(os.path.normpath(save_dir)) if save_dir is not None else None,
        save_ckpt=Path(save_ckpt),
        options=options,
        training=training,
        cwd=cwd or Path.cwd(),
        suffix=suffix,
        save_url=save_url,
    )


def normalized_spec(spec: str, cwd: Path | None = None) -> str:
    """A restart handle as an absolute path, ``..`` folded (``latest`` as is).

    ``run/../t1/models`` names ``<cwd>/t1/models``: messages and the path
    handed to deepmd-kit never carry the detour. A word, or a word and a
    colon (``best``, ``best:models``, ``step:200``), that names nothing on
    disk is a resolver plugin's specification and is handed on as given.
    """
    if spec == "latest" or not spec.strip() or "://" in spec:
        return spec
    path = os.path.join(cwd or Path.cwd(), spec)
    if _PLUGIN_SPEC.fullmatch(spec) and entry_or_none(Path(path)) is None:
        return spec
    return os.path.normpath(path)


def is_directory(path: Path) -> bool:
    """Whether ``path`` is a directory (links followed); an unreadable name is not."""
    found = entry_or_none(path, follow=True)
    return found is not None and found.is_dir


#: What a resolver plugin's specification looks like: a word, then ``:...``.
_PLUGIN_SPEC = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(:.*)?", re.DOTALL)


def resolve_for_reading(pm, spec: str, *, suffix: str, cwd: Path | None = None):
    """Resolve the model handle of a reading command (freeze, change-bias).

    ``latest`` and the working directory read deepmd-kit's ``checkpoint``
    pointer there; a directory its own pointer, alias or newest committed
    checkpoint, for any ``save_ckpt`` name (read from its commit records); a
    prefix its alias. Candidates are hashed; nothing is moved aside, since
    another run may be writing the directory. The command loads what is
    found: its verified bytes are kept (``Resolved.payload``).
    """
    from ..plugin.hooks import Hooks
    from ..resolution import resolve_restart
    from .naming import primary_family_in

    cwd = cwd or Path.cwd()
    spec = normalized_spec(str(spec), cwd)
    family = Family("model.ckpt", suffix)
    directory = Path(spec)
    if spec != "latest" and is_directory(directory):
        family = primary_family_in(directory, suffix, family)
    context = ResolveContext(family, cwd=cwd, digest=True, quarantine=False, load=True)
    found = resolve_restart(Hooks.of(pm), spec, context)
    for warning in found.warnings:
        log.warning("%s", warning)
    return found


def for_deepmd(config: dict[str, Any], settings: RunSettings) -> dict[str, Any]:
    """The training input as deepmd-kit is handed it.

    A ``save_dir`` on object storage becomes its local staging directory:
    deepmd-kit's own checkpoint code only ever sees a local path.
    """
    training = config.get("training")
    if settings.save_url is not None and isinstance(training, dict):
        training["save_dir"] = str(settings.save_dir)
    return config
