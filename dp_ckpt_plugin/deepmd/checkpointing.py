"""The trainer side every deepmd-kit host shares.

A host's trainer subclass (``pt_expt/trainer.py``, ``pt/trainer.py``) only
assembles deepmd-kit's payload and calls into a :class:`HostRun` at three
points of deepmd-kit's loop:

- :meth:`HostRun.save`: hand the payloads of one step (periodic and EMA) to
  the store, with the one-line report of the save;
- :meth:`HostRun.check_stop`: at the start of each training step, stop with
  a checkpoint if a stop signal came (:mod:`.preempt`);
- :meth:`HostRun.finish`: wait for the last background save and say where
  the latest checkpoint is.

Also here: the retention policies set once the run length is known, the
translation of deepmd-kit's ``load_state_dict`` error into one sentence, and
the atomic write of files that stay outside the store (best-validation
checkpoints, a run without ``save_dir``: :meth:`HostRun.write_atomic`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..storage import local_storage
from ..store.core import CheckpointStore
from .exact import KEY, ExactResume, on_cpu, read_entry, restart_line, restore_rngs
from .loading import MISSING, ServedPayloads
from .logs import SaveReport, finished_line
from .naming import ema_prefix
from .origin import Changes
from .preempt import Stopped, StopSignals
from .retention_args import periodic_policy
from .settings import RunSettings

log = logging.getLogger("dp_ckpt_plugin")


@dataclass
class HostRun:
    """A training run of a host: what the preflight found, what its trainer calls.

    Attributes
    ----------
    store : CheckpointStore or None
        The store of ``save_dir``; ``None`` keeps deepmd-kit's layout.
    training : Mapping
        The normalized ``training`` section (retention keys).
    resumed_from : Path or None
        The checkpoint the run starts from, named when it does not fit.
    background : bool
        Whether saves run in the store's background writer.
    report : SaveReport or None
        The observer that writes one line per save.
    stop : StopSignals or None
        The stop signals of the run.
    cwd : Path or None
        The working directory (for paths in messages).
    retention : Mapping or None
        The ``training._dp_ckpt.retention`` options (milestones, best K).
    host : str or None
        The host folder (``pt_expt``, ``pt``) whose trainer this is.
    exact_resume : bool
        ``training._dp_ckpt.exact_resume`` (:mod:`.exact`).
    payloads : ServedPayloads
        The verified bytes of the checkpoints the run starts from, served to
        deepmd-kit's loaders until the loop starts (:mod:`.loading`).
    changes : Changes or None
        With ``--restart``: what changed since its checkpoint (:mod:`.origin`).
    chief : bool
        Whether this process is rank 0, the one that says what happened.
    """

    store: CheckpointStore | None
    training: Mapping[str, Any] = field(default_factory=dict)
    resumed_from: Path | None = None
    background: bool = False
    report: SaveReport | None = None
    stop: StopSignals | None = None
    cwd: Path | None = None
    retention: Mapping[str, Any] | None = None
    host: str | None = None
    exact_resume: bool = True
    payloads: ServedPayloads = field(default_factory=ServedPayloads)
    changes: Changes | None = None
    chief: bool = True
    #: The step of the last checkpoint this run saved.
    last_saved: int | None = None

    #: What :func:`~.prepare.prepare_run` read and resolved: the checkpoint
    #: part of the input, and the checkpoints to hand to deepmd-kit.
    settings: RunSettings | None = None
    restart: str | None = None
    init_model: str | None = None
    finetune: str | None = None

    def close(self) -> None:
        """Give the bytes up, restore the signal handlers, close the store (idempotent)."""
        try:
            self.payloads.stop()
            if self.stop is not None:
                self.stop.restore()
        finally:
            if self.store is not None:
                self.store.close()

    # -- set-up ----------------------------------------------------------------------
    def started(self, num_steps: int) -> None:
        """The trainer is built: set the retention windows."""
        if self.store is None:
            return
        primary = self.store.primary.prefix
        for prefix, cfg in self.store.families.items():
            cfg.policy = periodic_policy(
                self.training,
                self.retention,
                num_steps=num_steps,
                ema=prefix != primary,
            )

    def build(self, make: Callable[[], None]) -> None:
        """Run deepmd-kit's trainer constructor; a checkpoint that does not fit is one sentence."""
        try:
            make()
        except RuntimeError as exc:
            mismatch = describe_mismatch(str(exc))
            if self.resumed_from is None or mismatch is None:
                raise
            raise CheckpointError(
                f"checkpoint {self.resumed_from} does not fit the model of this "
                f"input: {mismatch}. Nothing was changed; restart from a "
                "checkpoint of this model, or use --finetune"
            ) from None

    def exact(self, rank: int, world_size: int, unsupported: str | None) -> ExactResume:
        """The trainer's side of exact resume (:mod:`.exact`) in this run."""
        changed = self.changes.data if self.changes is not None else None
        return ExactResume(self.exact_resume, rank, world_size, unsupported, changed)

    def restore(
        self,
        restart: str,
        exact: ExactResume,
        restore_data: Callable[[Any], str | None],
        *,
        step: int | None,
    ) -> Any:
        """Put the random generators and the data where the checkpoint left them.

        ``restore_data`` puts the host's data back and says why it cannot.
        Says in one line whether the run continues exactly; returns the
        checkpoint's entry (:data:`.exact.KEY`), as deepmd-kit's trainer loaded
        it from the verified bytes (read from those bytes if it did not).
        """
        entry = self.payloads.kept(restart, KEY, MISSING)
        if entry is MISSING:  # read onto the CPU already
            entry = read_entry(self.payloads.file(restart))
        else:
            entry = on_cpu(entry)
        found = exact.continuation(entry)
        why = restore_data(found.state["data"]) if found.exact else None
        if why is not None:
            found.state, found.reason = None, why
        if found.exact:
            restore_rngs(found.state["rng"])
        if self.chief:
            log.info("%s", restart_line(step, found, self.changes))
        return entry

    def loop_started(self) -> None:
        """The training loop starts: a stop signal now waits for a step boundary.

        The trainer is built: the checkpoint's bytes are given up.
        """
        self.payloads.stop()
        if self.stop is not None:
            self.stop.in_loop = True

    # -- saving ----------------------------------------------------------------------
    def write_atomic(self, path: str | Path, state: Any) -> None:
        """``torch.save`` a file outside the store: a temporary name, then ``os.replace``.

        Fsynced unless the store is not durable.
        """
        import torch

        durable = self.store.durable if self.store is not None else True
        storage, path = local_storage(), Path(path)
        storage.make_dirs(path.parent, durable=durable)
        tmp = storage.write_temp(
            path, lambda handle: torch.save(state, handle), durable=durable
        )
        storage.move_into_place(tmp, path, durable=durable)

    def family_names(self, with_ema: bool) -> tuple[str, str | None]:
        """The periodic family's prefix and the EMA one's (``None`` without EMA)."""
        primary = self.store.primary.prefix
        return primary, ema_prefix(primary) if with_ema else None

    def save(
        self,
        step: int,
        states: dict[str, Any],
        *,
        metrics: Mapping[str, Mapping[str, float] | None] | None = None,
    ) -> None:
        """Hand the payloads of ``step`` (one per family) to the store.

        ``metrics`` are the values the trainer reports for a family at this
        step (the displayed learning curve), recorded for best-K retention.
        """
        self.last_saved = step
        if self.chief and self.report is not None:
            self.report.begin(step, states, background=self.background)
        self.store.save_all(step, states, background=self.background, metrics=metrics)
        if self.chief and self.report is not None:
            self.report.handed_over(step)

    def check_stop(
        self,
        step: int,
        *,
        start_step: int,
        save: Callable[[int], None],
    ) -> None:
        """At the start of training step ``step``: stop here if a signal came.

        ``step`` steps are done. Every rank calls this at every step; when the
        ranks agree on a signal, ``save(step)`` commits the checkpoint of the
        steps done (unless it was just saved, or none was trained since the
        start), the last background save is waited for, and
        :class:`~.preempt.Stopped` is raised. Only the chief names the
        committed checkpoint.
        """
        if self.stop is None:
            return
        signum = self.stop.agreed()
        if not signum:
            return
        self.stop.finish()
        if step <= start_step:
            raise Stopped(signum)
        if step != self.last_saved:
            self.stop.announce(signum, step)
            save(step)
        path = None
        if self.store is not None and self.chief:
            self.store.wait()
            path = self.store.path_for(step)
        self.stop.settle()
        raise Stopped(signum, step, path)

    def finish(self) -> None:
        """After training: the last background save is done; say where it is."""
        if self.stop is not None:
            self.stop.finish()
        if self.store is None:
            return
        self.store.wait()
        remote = self.store.remote
        if self.chief and remote is not None:  # the end waits for the uploads
            remote.flush(remote.upload_wait)
        if self.chief:
            log.info("%s", finished_line(self.report, self.store, self.cwd))


_MISMATCH = (
    (
        re.compile(
            r"size mismatch for ([^:]+): copying a param with shape (.+?) from "
            r"checkpoint, the shape in current model is (.+?)\.?$"
        ),
        "parameter {0} has shape {1} in the checkpoint but {2} in the model",
    ),
    (
        re.compile(r'Missing key\(s\) in state_dict: "([^"]+)"'),
        "parameter {0} of the model is not in the checkpoint",
    ),
    (
        re.compile(r'Unexpected key\(s\) in state_dict: "([^"]+)"'),
        "the checkpoint holds parameter {0}, which the model does not have",
    ),
)


def describe_mismatch(text: str) -> str | None:
    """Name the first parameter a ``load_state_dict`` error says differs."""
    for line in text.splitlines():
        for pattern, message in _MISMATCH:
            found = pattern.search(line.strip())
            if found:
                return message.format(*found.groups())
    return None
