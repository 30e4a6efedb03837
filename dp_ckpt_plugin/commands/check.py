"""``dp-ckpt check INPUT --restart SPEC``: would this command load, before it is submitted.

``--restart``, ``--init-model`` or ``--finetune`` take what ``dp train``
takes; the store is the input's ``training.save_dir`` (relative to the
working directory, as ``dp train`` reads it). The command says which
checkpoint the handle resolves to (the same front door as a training run,
moving nothing: a corrupt candidate is skipped and reported, never
quarantined; nothing is written) and whether it will load:

- the model section the input gives is compared, key by key, with the one
  the checkpoint was trained with (the normalized input its record names,
  kept in its store). No model is built: keys the input leaves to
  deepmd-kit's defaults are not compared, and parameter shapes are not
  computed; a model section that differs may be refused when the trainer is
  built (shapes) or may load a model other than the checkpoint's;
- for ``--restart``, the other keys that differ (``training.numb_steps``)
  are listed: the continuation is then not the uninterrupted run.

Exit status: 0 when it will load (for ``--finetune``: the checkpoint is
found and readable; a changed model is what fine-tuning is for), 1 when it
will not (nothing found, a corrupt checkpoint, a model that differs), 3
when it cannot be told (the checkpoint keeps no input). ``--json`` is
documented in ``docs/command.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..checkpoint.provenance import ABSENT, flatten, value_text
from ..errors import CheckpointError
from ..storage import default_storage
from ..text import shown
from . import FAILURE, UsageError, add_digest_flag, is_remote, one_line, output
from .origins import private, read_input_file
from .show import as_json

HELP = "say whether --restart/--init-model/--finetune of an input will load"
DESCRIPTION = (
    "Resolve what dp train INPUT --restart SPEC (or --init-model, --finetune) "
    "would load, without building a model or writing anything, and say "
    "whether it will load: the input's model section against the one the "
    "checkpoint was trained with. Exit 0: it will; 1: it will not; 3: "
    "cannot tell."
)

#: Exit status when whether it loads cannot be told.
UNKNOWN = 3
HANDLES = ("restart", "init_model", "finetune")
#: The fields of ``show --json`` that ``check --json`` gives of the checkpoint.
CHECKPOINT_KEYS = ("path", "step", "family", "how", "checked", "committed", "warnings")
#: What ``will_load`` says, for people.
VERDICTS = {True: "will load", False: "will not load", None: "cannot tell"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``check``."""
    parser.add_argument("input", type=Path, help="the training input (JSON)")
    handle = parser.add_mutually_exclusive_group(required=True)
    for name in HANDLES:
        option = f"--{name.replace('_', '-')}"
        doc = f"what dp train {option} would take"
        handle.add_argument(option, dest=name, metavar="SPEC", help=doc)
    add_digest_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Check and print; the exit status says whether it will load."""
    handle = next(h for h in HANDLES if getattr(args, h) is not None)
    found = check(args.input, handle, getattr(args, handle), digest=args.digest)
    if args.json:
        output.print_json(found)
    else:
        show(found)
    if found["will_load"] is None:
        return UNKNOWN
    return 0 if found["will_load"] else FAILURE


def check(input_file: Path, handle: str, spec: str, *, digest: bool) -> dict[str, Any]:
    """The ``--json`` form (documented in docs/command.md)."""
    from .directory_view import DirectoryView

    config = read_input_file(input_file)
    store = _store_of(config)
    result: dict[str, Any] = {
        "input": str(input_file),
        "handle": handle,
        "spec": spec,
        "store": None if store is None else str(store),
        "checkpoint": None,
        "error": None,
        "will_load": False,
        "basis": None,
        "model_changes": [],
        "input_changes": [],
    }
    where = store if store is not None else _directory_of(spec)
    if where is None:
        return result | {
            "error": f"no store to resolve {spec!r} in: the input names no existing "
            "training.save_dir and the handle is no file or directory"
        }
    try:
        found = DirectoryView(where).resolve(spec, digest=digest)
    except CheckpointError as exc:
        return result | {"error": str(exc)}
    described = as_json(found, spec)
    result["checkpoint"] = {key: described[key] for key in CHECKPOINT_KEYS}
    if found.input is None:
        return result | {
            "will_load": None,
            "basis": "the checkpoint keeps no training input (its record predates "
            "provenance, or was adopted): whether the model fits cannot be told "
            "without building it",
        }
    given = {k: v for k, v in flatten(config).items() if not private(k)}
    theirs = flatten(found.input)
    changes = [
        {"key": k, "checkpoint": theirs.get(k), "input": v}
        for k, v in sorted(given.items())
        if theirs.get(k, ABSENT) != v
    ]
    result["model_changes"] = [c for c in changes if c["key"].startswith("model.")]
    if handle == "restart":
        result["input_changes"] = [
            c for c in changes if not c["key"].startswith("model.")
        ]
    if handle == "finetune":
        return result | {
            "will_load": True,
            "basis": "found and readable; fine-tuning loads it into the input's "
            "model (the model keys that differ are listed)",
        }
    return result | {
        "will_load": not result["model_changes"],
        "basis": "the model section the input gives, key by key, against the input "
        "the checkpoint was trained with (no model built: keys left to deepmd-kit's "
        "defaults are not compared, parameter shapes are not computed)",
    }


def _store_of(config: dict[str, Any]) -> Path | None:
    """The input's ``training.save_dir``, when it is an existing local directory."""
    training = config.get("training")
    save_dir = training.get("save_dir") if isinstance(training, dict) else None
    if not isinstance(save_dir, str) or not save_dir:
        return None
    if is_remote(save_dir):
        raise UsageError(f"{save_dir}: check reads local stores")
    path = Path(save_dir)
    entry = default_storage().entry(path, follow=True)
    return path if entry is not None and entry.is_dir else None


def _directory_of(spec: str) -> Path | None:
    """The directory a handle naming a file or directory lies in."""
    path = Path(spec)
    entry = default_storage().entry(path, follow=True)
    if entry is None:
        return None
    return path if entry.is_dir else path.parent


def show(found: dict[str, Any]) -> None:
    """Print for people."""
    out = output.console()
    flag = "--" + found["handle"].replace("_", "-")
    head = f"dp train {shown(found['input'])} {flag} {shown(found['spec'])}"
    checkpoint = found["checkpoint"]
    if checkpoint is None:
        out.print(f"{head}: will not load: {shown(one_line(found['error']))}")
        return
    out.print(
        f"{head} would load {shown(checkpoint['path'])} (step "
        f"{checkpoint['step']}), {shown(checkpoint['how'])}; checked: "
        f"{shown(checkpoint['checked'])}"
    )
    for warning in checkpoint["warnings"]:
        out.print(f"warning: {shown(warning)}")
    out.print(f"{VERDICTS[found['will_load']]}: {found['basis']}")
    for title, key in (("model", "model_changes"), ("input", "input_changes")):
        for c in found[key]:
            old = value_text(ABSENT if c["checkpoint"] is None else c["checkpoint"])
            out.print(
                f"  {title} differs: {shown(c['key'])}  checkpoint {shown(old)}, "
                f"input {shown(value_text(c['input']))}"
            )
    if found["input_changes"]:
        out.print(
            "  (a restart continues with them; those that change the run, such "
            "as training.numb_steps, make it other than the uninterrupted run of "
            "this input, and dp train says which when it starts)"
        )
