"""An ``on_resolve_restart`` override: ``--restart step:<N>``.

A spec of the form ``step:200`` names the committed checkpoint of step 200 in
the store directory (the working directory without ``save_dir``). Any other
spec is left to the built-in resolver by returning ``None``. The file found is
handed back to the built-in rules, so it is verified against its commit
record like any other restart.
"""

from __future__ import annotations

from dp_ckpt_plugin import RestartNotFoundError, hookimpl, resolve

PREFIX = "step:"


@hookimpl
def on_resolve_restart(spec, context):
    """Resolve ``step:<N>``; leave every other spec to the next plugin."""
    if not spec.startswith(PREFIX):
        return None
    text = spec[len(PREFIX) :]
    if not text.isdigit():
        raise RestartNotFoundError(f"restart {spec!r}: {text!r} is not a step number")
    directory = context.store_dir or context.cwd
    path = directory / context.family.numbered(int(text))
    if not path.is_file():
        raise RestartNotFoundError(f"restart {spec!r}: there is no {path}")
    return resolve(str(path), context)
