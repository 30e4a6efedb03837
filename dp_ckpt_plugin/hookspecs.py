"""The hooks of dp_ckpt_plugin, in the order a checkpoint meets them.

Implement a hook by decorating a function of the same name with
:data:`dp_ckpt_plugin.hookimpl` in a module or class registered through the
``dp_ckpt`` entry-point group::

    [project.entry-points.dp_ckpt]
    my_plugin = "my_package.my_module"

The store runs its invariants itself, in a straight line: write the payload,
write the commit record, publish (pointer, alias, mirrors), call the
``on_commit`` observers, apply retention. Hooks extend that line; none of them
is the only way an invariant happens, so no plugin order or block list can
skip publication or retention.

A plugin may also offer object storages for URL schemes of its own
(``register_storages``).

The built-in formats and resolver are ordinary plugins marked ``trylast``, so a
third-party implementation runs before them and, for ``firstresult`` hooks,
can answer in their place. ``on_save_step``, ``on_commit``,
``on_resolve_restart`` and ``on_freeze`` are the project's public API.

The package calls these hooks only through :class:`dp_ckpt_plugin.plugin.hooks.Hooks`,
and verifies what a plugin proposes: a checkpoint ``on_resolve_restart``
returns is checked against its commit record by the front door before anyone
uses it, whatever the plugin checked itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .markers import PROJECT as PROJECT
from .markers import hookimpl as hookimpl
from .markers import hookspec

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, Commit
    from .formats import FormatInfo
    from .resolution import ResolveContext, Resolved
    from .storage.objects import StorageFactory


# -- formats ------------------------------------------------------------------


@hookspec
def register_formats() -> list[FormatInfo]:
    """Declare the serialization formats a plugin provides.

    Called whenever a store or manager looks a format up by name.

    Returns
    -------
    list of dp_ckpt_plugin.FormatInfo
        Each gives a format's ``name`` (as passed to ``format=``) and its file
        ``suffix`` (such as ``".pt"``).
    """


# -- save ---------------------------------------------------------------------


@hookspec(firstresult=True)
def on_save_step(format: str, step: int, state: Any, file: BinaryIO) -> object | None:
    """Serialize the payload of one step into an open file.

    Called on the chief rank with a binary file object opened on a temporary
    name inside the store directory. The store flushes, fsyncs, hashes and
    moves the file into place afterwards; an implementation only writes bytes.

    Parameters
    ----------
    format : str
        Name of the format that must write; an implementation of another
        format returns ``None``.
    step : int
        Training step of the payload.
    state : object
        What the trainer saves (for the torch format, the dict deepmd-kit's
        trainer passes to ``torch.save``).
    file : BinaryIO
        Where to write, positioned at 0, readable and seekable.

    Returns
    -------
    object or None
        Anything but ``None`` means "written"; the first such result ends the
        call. Raise :class:`TypeError` naming the key path for a value the
        format cannot round-trip exactly.
    """


@hookspec(firstresult=True)
def on_load_step(format: str, path: Path, file: BinaryIO | None) -> Any | None:
    """Read back a payload written by :func:`on_save_step`.

    Called after the path was resolved and, where a commit record exists,
    verified against it. The store reads the file once, verifies those bytes
    and hands them over as ``file``: read the payload from ``file``, not
    from ``path`` (a file replaced at ``path`` since it was verified is then
    never loaded). An implementation written for dp-ckpt-plugin 0.3, which
    takes ``format`` and ``path`` only, still works.

    Parameters
    ----------
    format : str
        Name of the format that wrote the file; an implementation of another
        format returns ``None`` without reading ``file``.
    path : pathlib.Path
        The checkpoint file (for messages, and for a reader that needs a
        name, such as a suffix).
    file : BinaryIO or None
        The verified bytes of ``path``, positioned at 0, readable and
        seekable; ``None`` when a caller gave none (the built-in formats then
        read ``path`` through the storage, once).

    Returns
    -------
    object or None
        The payload, or ``None`` when this implementation does not read that
        format.
    """


# -- commit -------------------------------------------------------------------


@hookspec
def on_commit(commit: Commit, checkpoint: Checkpoint) -> None:
    """Observe a checkpoint that is durable, committed and published.

    Called on the chief rank, once per checkpoint, after its commit record was
    written and the family's pointer, alias and mirrors were moved to it, and
    before retention runs (so an observer may still copy the checkpoint that
    retention is about to replace). Observers log, mirror elsewhere, notify.

    Every observer is called even if an earlier one raised: an exception is
    logged as a warning naming the plugin and the checkpoint, and the save
    goes on (the checkpoint stays committed and published, retention runs).

    An observer takes any of the arguments below, by name.

    Parameters
    ----------
    commit : dp_ckpt_plugin.Commit
        The commit, read only: ``checkpoint``, the store's ``directory`` and
        ``format``, what the pointer and alias name now (``published``) and
        the store's ``families``.
    checkpoint : dp_ckpt_plugin.Checkpoint
        ``commit.checkpoint``: ``path``, ``step``, ``family`` and commit
        ``record`` of the new checkpoint.
    """


# -- restart ------------------------------------------------------------------


@hookspec(firstresult=True)
def on_resolve_restart(spec: str, context: ResolveContext) -> Resolved | None:
    """Turn a restart specification into a checkpoint.

    Called on the chief rank for ``--restart``, ``--init-model``,
    ``dp freeze -c`` and :meth:`CheckpointManager.resolve`, before any model
    or data is built; the answer is broadcast to the other ranks.

    Parameters
    ----------
    spec : str
        What the user gave: ``latest``, a directory, a file or a prefix,
        exactly as typed.
    context : dp_ckpt_plugin.ResolveContext
        Where to look (store directory, working directory, family) and how
        strictly to verify.

    Returns
    -------
    dp_ckpt_plugin.Resolved or None
        The first non-``None`` result wins. Raise
        :class:`~dp_ckpt_plugin.RestartNotFoundError` to fail. Whatever is
        returned is verified by the front door before it is used: a link is
        followed to the checkpoint it names, and that file is checked
        against its commit record at the level the context asks for (a
        file without a record is accepted unverified, with a warning). A
        plugin may return ``dp_ckpt_plugin.resolve(str(path), context)``, or
        just a :class:`~dp_ckpt_plugin.Resolved` naming the file.
    """


# -- freeze -------------------------------------------------------------------


@hookspec(firstresult=True)
def on_freeze(checkpoint: Checkpoint, output: str, options: dict) -> str | None:
    """Turn a resolved checkpoint into a frozen model.

    Parameters
    ----------
    checkpoint : dp_ckpt_plugin.Checkpoint
        The checkpoint :func:`on_resolve_restart` chose (``path``, ``step``,
        ``record`` or ``None`` for a file written without the plugin).
    output : str
        Where the frozen model goes.
    options : dict
        Further options of the freeze command: ``host`` names the trainer
        that wrote the checkpoint (such as ``"pt_expt"``); others (such as
        ``head``) are the host's.

    Returns
    -------
    str or None
        The path of the frozen model; the first non-``None`` result wins.
    """


# -- storages -----------------------------------------------------------------


@hookspec
def register_storages() -> dict[str, StorageFactory]:
    """Offer object storages for URL schemes of the plugin's own.

    Asked of the process's plugin manager
    (:func:`dp_ckpt_plugin.objectstore.registry.plugin_manager`) the first
    time a URL's scheme is not a built-in one (``s3``, ``gs``, ``az``,
    ``abfs``, ``abfss``), and whenever such a scheme is looked up.

    Returns
    -------
    dict
        Scheme (lowercase, ``[a-z][a-z0-9+.-]*``, such as ``"myfs"``) to a
        factory ``factory(url, **options)`` returning an
        :class:`~dp_ckpt_plugin.storage.objects.ObjectStorage`. An offer of a
        built-in scheme or ``file`` is ignored; of a scheme offered twice, the
        plugin called first wins.
    """
