"""What a ``dp --pt-expt`` run needs to know before deepmd-kit builds anything.

The training input is read once, early (a JSON or YAML file, as deepmd-kit reads
it), to validate ``training.save_dir`` and the ``dp_ckpt`` section and to learn
the checkpoint prefix, so that a bad configuration or restart handle fails in
seconds rather than after the data and model are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..argcheck import PluginOptions, check_save_dir, plugin_options
from ..errors import ConfigError
from ..layout import Family
from ..resolve import ResolveContext

SUFFIX = ".pt"


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
        The validated ``dp_ckpt`` section.
    training : dict
        The raw ``training`` section (retention keys are read from it).
    cwd : Path
        The working directory of the run.
    """

    save_dir: Path | None
    save_ckpt: Path
    options: PluginOptions
    training: dict[str, Any] = field(default_factory=dict)
    cwd: Path = field(default_factory=Path.cwd)

    @property
    def family(self) -> Family:
        """The periodic family (the one ``latest`` means)."""
        return Family(self.save_ckpt.name, SUFFIX)

    def resolve_context(self, *, chief: bool = True) -> ResolveContext:
        """Where ``--restart``/``--init-model`` look, and how strictly."""
        return ResolveContext(
            family=self.family,
            store_dir=self.save_dir,
            cwd=self.cwd,
            prefix_path=self.save_ckpt,
            sha256=self.options.verify == "sha256",
            quarantine=self.options.quarantine and chief,
        )


def read_settings(config: dict[str, Any], *, cwd: Path | None = None) -> RunSettings:
    """Validate and take out the plugin's part of a loaded training input.

    The ``dp_ckpt`` section is removed from ``config`` (deepmd-kit's strict
    check would reject it).

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
        save_dir=save_dir,
        save_ckpt=Path(save_ckpt),
        options=options,
        training=training,
        cwd=cwd or Path.cwd(),
    )
