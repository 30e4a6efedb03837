"""What a deepmd-kit backend folder declares about itself, once.

Each backend folder (``pt_expt/``, ``pt/``) defines ``DESCRIPTOR``, a
:class:`HostDescriptor`, in its ``__init__`` (which imports nothing heavy);
the shared code of this package (the entry point, the command dispatch, the
settings, the log lines, the preflight) reads the descriptor instead of
spelling a backend's names itself. A new deepmd-kit backend is a new folder
with its descriptor and its ``train``, ``trainer`` and ``freeze`` modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pluggy

#: The backend folders of this package, in the order they are registered.
NAMES = ("pt_expt", "pt")


@dataclass(frozen=True)
class HostDescriptor:
    """One deepmd-kit backend as the plugin takes it over.

    Attributes
    ----------
    name : str
        The folder (``pt_expt``), also the ``host`` ``on_freeze`` sees.
    flag : str
        deepmd-kit's command-line flag (``--pt-expt``).
    backend : tuple of (str, str)
        deepmd-kit's backend class: its module and name.
    keys : tuple of str
        The keys deepmd-kit registers that backend under.
    deepmd_main : str
        deepmd-kit's command-line module of the backend (``train``,
        ``freeze``, ``change_bias``, ``main``).
    trainer : str
        deepmd-kit's module of the ``Trainer`` class the host subclasses.
    format : str
        The store's format for this backend's checkpoints.
    suffix : str
        The file suffix of its checkpoints.
    reports_metrics : bool
        Whether the trainer hands the displayed learning-curve values to
        each periodic save (what ``keep_best`` ranks by).
    main_lines : tuple of (str, str)
        What deepmd-kit's ``main`` of the backend logs once its log handles
        are set, before it runs a command: ``(level, message)``, the message
        formatted with ``version`` (deepmd-kit's). The plugin's ``main``
        replaces deepmd-kit's for ``train``, ``freeze`` and ``change-bias``
        and says them in its place, on the logger of :attr:`deepmd_main`.
    """

    name: str
    flag: str
    backend: tuple[str, str]
    keys: tuple[str, ...]
    deepmd_main: str
    trainer: str
    format: str = "torch"
    suffix: str = ".pt"
    reports_metrics: bool = True
    main_lines: tuple[tuple[str, str], ...] = ()

    def module_name(self, name: str) -> str:
        """The dotted name of the host folder's module ``name`` (``train``, ``freeze``, ...)."""
        return f"dp_ckpt_plugin.deepmd.{self.name}.{name}"

    def module(self, name: str):
        """Import the host folder's module ``name`` (``train``, ``trainer``, ``freeze``)."""
        return importlib.import_module(self.module_name(name))


def descriptor(name: str) -> HostDescriptor:
    """The descriptor of the backend folder ``name`` (imports nothing heavy)."""
    if name not in NAMES:
        raise KeyError(f"no deepmd-kit host {name!r}; hosts: {', '.join(NAMES)}")
    return importlib.import_module(f"dp_ckpt_plugin.deepmd.{name}").DESCRIPTOR


def plugin_manager(name: str) -> pluggy.PluginManager:
    """The plugin manager of a ``dp`` command: the core's plugins and host ``name``'s."""
    from ..plugin import get_plugin_manager

    freezer = descriptor(name).module_name("freeze")
    return get_plugin_manager(host_plugins={"freeze": freezer})


def descriptors() -> list[HostDescriptor]:
    """Every host's descriptor, in :data:`NAMES` order."""
    return [descriptor(name) for name in NAMES]
