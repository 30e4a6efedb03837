"""``dp --pt-expt`` and ``dp --pt`` with dp_ckpt_plugin: train, freeze, change-bias.

Every other command goes to deepmd-kit's own backend entry point unchanged.
A host folder (``pt_expt/``, ``pt/``) supplies what differs between
deepmd-kit backends: the training entry point (``train.py``), the trainer
(``trainer.py``) and the freezer (``freeze.py``); everything here is shared.

A mistake of the user's (a bad ``save_dir``, an unknown option, a restart
handle that names nothing, a directory another run holds) ends with one
message and exit status 1, never a traceback. A stop signal ends training
with a checkpoint and exit status 128 + the signal number
(:mod:`.preempt`). Ctrl-C (``SIGINT``) ends the process by ``SIGINT`` itself,
once the store is closed, as Python does for an uncaught
``KeyboardInterrupt``: a shell reports 130, and a script that ran ``dp``
stops too (a shell goes on after a child that merely exited 130).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from pathlib import Path

from ..errors import CheckpointError
from .host import descriptor, plugin_manager
from .logs import (
    command_loggers,
    describe_checked,
    describe_how,
    say_main_lines,
    scoped_logging,
    shorten_paths,
    shown,
)
from .preempt import Stopped

log = logging.getLogger("dp_ckpt_plugin")

#: Commands the plugin handles; deepmd-kit's backend runs the others.
COMMANDS = ("train", "freeze", "change-bias")


def main(args: list[str] | argparse.Namespace | None = None, *, host: str) -> None:
    """Run a ``dp`` command of ``host`` (deepmd-kit's backend ``main`` signature)."""
    from deepmd.main import parse_args

    flags = args if isinstance(args, argparse.Namespace) else parse_args(args=args)
    if flags.command not in COMMANDS:
        importlib.import_module(descriptor(host).deepmd_main).main(flags)
        return
    from deepmd.loggers.loggers import set_log_handles

    with scoped_logging(command_loggers()):
        set_log_handles(
            flags.log_level,
            Path(flags.log_path) if flags.log_path else None,
            mpi_log=None,
        )
        share_deepmd_handlers(log)
        shorten_paths()
        say_main_lines(host)
        run_command(flags, host)


def run_command(flags: argparse.Namespace, host: str) -> None:
    """Run the command; a user's mistake or a stop ends it with one line."""
    try:
        run = {"train": run_train, "freeze": run_freeze, "change-bias": run_change_bias}
        run[flags.command](flags, host)
    except CheckpointError as exc:
        if not exc.said:  # a line found in the background was said there
            log.error("%s", exc)
        sys.exit(1)
    except Stopped as stop:
        log.warning("%s", stopped_line(stop))
        if stop.signum == signal.SIGINT:
            die_by(signal.SIGINT)
        sys.exit(stop.status)
    except KeyboardInterrupt:
        log.warning("%s", ABORTED if flags.command == "train" else INTERRUPTED)
        die_by(signal.SIGINT)


#: What ``dp`` says when Ctrl-C aborted a command (a second one while stopping).
ABORTED = (
    "SIGINT: aborted; the steps since the last committed checkpoint are not "
    "saved, nothing half-written is visible, and --restart latest continues "
    "from the last committed checkpoint (exit status 130)"
)

#: ... and when it interrupted another command.
INTERRUPTED = "SIGINT: interrupted (exit status 130)"


def die_by(signum: int) -> None:
    """End this process by ``signum`` with its default action (the store is closed).

    Log handlers and the standard streams are flushed first; the slow
    interpreter teardown (seconds with torch's DataLoader) is skipped.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # only if the signal could not end the process


def run_train(flags: argparse.Namespace, host: str) -> None:
    """``dp train`` through the host's ``train.train(flags, prepared)``.

    A single process validates the input, takes the lock and resolves the
    restart before torch and deepmd-kit's training code are imported, so a
    mistake is reported within a second. Whatever happens, the store is
    closed (its lock and holder file removed) before the command ends.
    """
    prepared = None
    if os.environ.get("LOCAL_RANK") is None:
        from ..ranks import SingleProcess
        from .prepare import prepare_training

        prepared = prepare_training(host, flags.INPUT, flags, SingleProcess())
    try:
        descriptor(host).module("train").train(flags, prepared)
    finally:
        if prepared is not None:
            prepared.close()


def resolve_model(pm, host: str, spec: str, command: str, said: str):
    """Resolve the model handle of ``freeze -c`` or ``change-bias`` and say what it found.

    Verified against its commit record and read once (``Resolved.payload``);
    a fallback to an older checkpoint is refused (:func:`refuse_fallback`).
    """
    from .settings import resolve_for_reading

    found = resolve_for_reading(pm, spec, suffix=descriptor(host).suffix)
    refuse_fallback(command, spec, found)
    how, checked = describe_how(found), describe_checked(found)
    log.info("%s %s, %s; %s", said, shown(found.path), how, checked)
    return found


def run_freeze(flags: argparse.Namespace, host: str):
    """``dp freeze -c <handle>``: resolve, then the ``on_freeze`` of ``host``.

    The freezer (deepmd-kit's ``torch.load`` of the path) reads the bytes
    the resolution verified.
    """
    from ..plugin.hooks import Hooks
    from ..resolution import payload_of
    from .heads import check_head
    from .loading import ServedPayloads

    pm = plugin_manager(host)
    spec = flags.checkpoint_folder
    found = resolve_model(pm, host, spec, "freeze -c", "freezing")
    options = {"host": host, **descriptor(host).module("freeze").freeze_options(flags)}
    payload = payload_of(found)
    command = f"dp {descriptor(host).flag} freeze -c {spec}"
    check_head(payload, options.get("head"), command=command)
    with ServedPayloads([payload]):
        return Hooks(pm).freeze(found.checkpoint, flags.output, options)


def run_change_bias(flags: argparse.Namespace, host: str) -> None:
    """``dp change-bias`` whose model may be ``latest``, a directory or a prefix.

    An existing file is used as given. A handle is resolved as ``freeze -c``
    resolves (deepmd-kit's ``change_bias`` loads the verified bytes), and its
    result goes to ``<checkpoint name>_updated.pt`` in the working directory
    unless ``-o`` says otherwise: nothing is written into a checkpoint
    directory.
    """
    from ..resolution import payload_of
    from ..storage import is_file
    from .loading import ServedPayloads

    spec = flags.INPUT
    served = ServedPayloads()
    if not is_file(Path(spec)):
        said = f"change-bias {spec}:"
        found = resolve_model(plugin_manager(host), host, spec, "change-bias", said)
        served.add(payload_of(found))
        flags.INPUT = str(found.path)
        if flags.output is None:
            flags.output = f"{found.path.stem}_updated{found.path.suffix}"
    with served:
        importlib.import_module(descriptor(host).deepmd_main).change_bias(
            input_file=flags.INPUT,
            mode=flags.mode,
            bias_value=flags.bias_value,
            datafile=flags.datafile,
            system=flags.system,
            numb_batch=flags.numb_batch,
            model_branch=flags.model_branch,
            output=flags.output,
        )


#: Set to a true value, ``freeze`` and ``change-bias`` use an older checkpoint
#: when the newest one a handle names is unusable (with a warning).
ALLOW_FALLBACK_ENV = "DP_CKPT_ALLOW_FALLBACK"


def refuse_fallback(command: str, spec: str, found) -> None:
    """Refuse a model that is not the one ``spec`` names (``Resolved.fell_back``).

    A freeze or change-bias makes a file that scripts deploy or test: an
    older checkpoint in place of a corrupt or uncommitted newest one must not
    pass for success. Naming the older file (or ``DP_CKPT_ALLOW_FALLBACK=1``)
    uses it; the warnings said above name what was skipped and why.

    Raises
    ------
    CheckpointError
        When resolution fell back and no fallback is allowed.
    """
    if not found.fell_back:
        return
    step = f" (step {found.step})" if found.step is not None else ""
    allowed = os.environ.get(ALLOW_FALLBACK_ENV, "").strip().lower()
    if allowed in {"1", "true", "yes", "on"}:
        log.warning(
            "%s %s: using the older %s%s in place of the newest, as %s is set",
            command,
            spec,
            shown(found.path),
            step,
            ALLOW_FALLBACK_ENV,
        )
        return
    raise CheckpointError(
        f"{command} {spec}: the newest checkpoint it names is unusable (see the "
        f"warnings above), and the plugin does not put the older "
        f"{shown(found.path)}{step} in its place without being asked: name that "
        f"file instead of {spec} to use it, or set {ALLOW_FALLBACK_ENV}=1"
    )


def stopped_line(stop: Stopped) -> str:
    """What ``dp`` says when a stop signal ended training."""
    status = f"exit status {stop.status}"
    if stop.step is None:
        return f"{stop.name}: stopped before training any step; no new checkpoint ({status})"
    where = f" {shown(stop.path)} is committed;" if stop.path is not None else ""
    return (
        f"{stop.name}: stopped after step {stop.step};{where} continue with "
        f"--restart latest ({status})"
    )


def share_deepmd_handlers(logger: logging.Logger) -> None:
    """Send this package's log records where deepmd-kit sends its own."""
    source = logging.getLogger("deepmd")
    logger.handlers = list(source.handlers)
    logger.setLevel(source.level)
    logger.propagate = False
