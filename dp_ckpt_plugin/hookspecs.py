"""The hooks of dp_ckpt_plugin, in the order a run meets them.

Implement a hook by decorating a function of the same name with
:data:`dp_ckpt_plugin.hookimpl` in a module or class that you register through
the ``dp_ckpt`` entry-point group::

    [project.entry-points.dp_ckpt]
    my_plugin = "my_package.my_module"

Built-in implementations are ordinary plugins marked ``trylast`` (the publish
step ``tryfirst``), so a third-party implementation runs before them and, for
``firstresult`` hooks, can answer in their place.
"""

from __future__ import annotations

import pluggy

#: Project name shared by the hook markers and the plugin manager.
PROJECT = "dp_ckpt"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- backends -----------------------------------------------------------------


@hookspec
def register_backends():
    """Declare the serialization backends a plugin provides.

    Called once when the plugin manager is asked for its backends.

    Returns
    -------
    list of dp_ckpt_plugin.backends.BackendInfo
        Each gives a backend's ``name`` (as passed to ``backend=``) and its file
        ``suffix`` (such as ``".pt"``).
    """


# -- save ---------------------------------------------------------------------


@hookspec(firstresult=True)
def on_save_step(backend, step, state, file):
    """Serialize the payload of one step into an open file.

    Called on the chief rank with a binary file object opened on a temporary
    name inside the store directory. The store flushes, fsyncs and moves the
    file into place afterwards; an implementation only writes bytes.

    Parameters
    ----------
    backend : str
        Name of the backend that must write; an implementation for another
        backend returns ``None``.
    step : int
        Training step of the payload.
    state : object
        What the trainer saves (for the torch backend, the dict deepmd-kit's
        trainer passes to ``torch.save``).
    file : BinaryIO
        Where to write, positioned at 0, readable and seekable.

    Returns
    -------
    object or None
        Anything but ``None`` means "written"; the first such result ends the call.
    """


@hookspec(firstresult=True)
def on_load_step(backend, path):
    """Read back a payload written by :func:`on_save_step`.

    Called after the path was resolved and, where a commit record exists,
    verified against it.

    Parameters
    ----------
    backend : str
        Name of the backend that wrote the file.
    path : pathlib.Path
        The checkpoint file.

    Returns
    -------
    object or None
        The payload, or ``None`` when this implementation does not read that
        backend.
    """


# -- commit -------------------------------------------------------------------


@hookspec
def on_commit(store, checkpoint):
    """React to a checkpoint that is durable and committed.

    Called on the chief rank, once per checkpoint, right after its commit
    record was written. The built-in publisher (``tryfirst``) moves the latest
    pointer and alias to it; the built-in pruner (``trylast``) then applies
    retention. Observers (logging, copying elsewhere) fit between them. An
    exception stops the remaining implementations and reaches the trainer.

    Parameters
    ----------
    store : dp_ckpt_plugin.store.CheckpointStore
        The store the checkpoint belongs to.
    checkpoint : dp_ckpt_plugin.store.Checkpoint
        Path, step, family and commit record of the new checkpoint.
    """


# -- restart ------------------------------------------------------------------


@hookspec(firstresult=True)
def on_resolve_restart(spec, context):
    """Turn a restart specification into a checkpoint.

    Called for ``--restart``, ``--init-model``, ``dp freeze -c`` and
    :meth:`CheckpointManager.resolve`, before any model or data is built.

    Parameters
    ----------
    spec : str
        What the user gave: ``latest``, a directory, a file or a prefix.
    context : dp_ckpt_plugin.resolve.ResolveContext
        Where to look (store directory, working directory, family) and how
        strictly to verify.

    Returns
    -------
    dp_ckpt_plugin.resolve.Resolved or None
        The first non-``None`` result wins. Raise
        :class:`~dp_ckpt_plugin.errors.RestartNotFoundError` to fail.
    """


# -- freeze -------------------------------------------------------------------


@hookspec(firstresult=True)
def on_freeze(checkpoint, output, options):
    """Turn a resolved checkpoint into a frozen model.

    Parameters
    ----------
    checkpoint : dp_ckpt_plugin.resolve.Resolved
        The checkpoint :func:`on_resolve_restart` chose.
    output : str
        Where the frozen model goes.
    options : dict
        Further options of the freeze command (such as ``head``).

    Returns
    -------
    str or None
        The path of the frozen model; the first non-``None`` result wins.
    """
