"""Class 7, a restart through a link is verified too (rules 18-20, 32).

Every way of naming the newest checkpoint (step 3) of a store ``D`` -- the
file, a symlink to it in ``D`` and outside ``D``, the alias
``D/model.ckpt<suffix>``, the directory ``D``, the prefix ``D/model.ckpt``,
the pointer file ``D/checkpoint``, and ``latest`` -- x the damage and the
level that must see it (one byte flipped, same size, with verify="digest";
the file truncated, with verify="size" and verify="digest") x the formats
``hdf5`` and ``torch``: 8 x 3 x 2 = 48 generated cases, each through
``resolve`` and ``restore``.

Named explicitly (the file or a link to it), the damaged checkpoint must
raise ``CorruptCheckpointError``; named any other way, resolution may raise
``CorruptCheckpointError`` or fall back to an older committed checkpoint.
Never are the damaged bytes handed back as data, nor is any other error
raised.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import BACKENDS, payload_mismatches, plugin_manager
from trust_cases import (
    PREFIX,
    alias_name,
    attempt,
    ckpt_name,
    clone,
    flip_payload_byte,
    manager,
    step_of,
    truncate,
)

from dp_ckpt_plugin.errors import CorruptCheckpointError

NEWEST = 3


def spec_for(name, store, elsewhere, backend):
    """The restart specification that names the newest checkpoint as ``name`` says."""
    newest = store / ckpt_name(NEWEST, backend)
    if name == "file":
        return str(newest)
    if name == "link-in-store":
        link = store / f"mine{newest.suffix}"
        os.symlink(newest.name, link)
        return str(link)
    if name == "link-outside":
        elsewhere.mkdir(exist_ok=True)
        link = elsewhere / f"mine{newest.suffix}"
        os.symlink(newest, link)
        return str(link)
    if name == "alias":
        return str(store / alias_name(backend))
    if name == "directory":
        return str(store)
    if name == "prefix":
        return str(store / PREFIX)
    if name == "pointer":
        return str(store / "checkpoint")
    if name == "latest":
        return "latest"
    raise ValueError(name)


NAMES = (
    "file",
    "link-in-store",
    "link-outside",
    "alias",
    "directory",
    "prefix",
    "pointer",
    "latest",
)
EXPLICIT = {"file", "link-in-store", "link-outside"}
DAMAGE = [("flip", "digest"), ("truncate", "size"), ("truncate", "digest")]


def damaged_store(root, backend, damage):
    store = clone(root / "D", backend)
    newest = store / ckpt_name(NEWEST, backend)
    if damage == "flip":
        flip_payload_byte(newest, NEWEST, backend)
    else:
        truncate(newest)
    return store


@pytest.mark.parametrize(("damage", "verify"), DAMAGE)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_damaged_checkpoint_is_never_handed_back(
    tmp_path, backend, name, damage, verify
):
    pm = plugin_manager()
    problems = []
    for op in ("resolve", "restore"):
        root = tmp_path / op
        store = damaged_store(root, backend, damage)
        spec = spec_for(name, store, root / "elsewhere", backend)
        m = manager(store, backend, pm=pm, verify=verify, max_keep=0)
        try:
            got = attempt(getattr(m, op), spec)
        finally:
            m.close()
        where = f"{op}({spec!r}) with verify={verify!r} after a {damage}"
        if got.kind == "crash":
            problems.append(f"{where}: {got}")
            continue
        if got.kind == "refused":
            if not isinstance(got.error, CorruptCheckpointError):
                problems.append(f"{where} refused without naming the damage: {got}")
            continue
        if name in EXPLICIT:
            problems.append(f"{where} did not raise CorruptCheckpointError: {got}")
        path = got.value if op == "resolve" else got.value.path
        real = Path(os.path.realpath(path))
        step = step_of(real.name, backend)
        if real.parent != store.resolve() or step not in (1, 2):
            problems.append(f"{where} gave {path} ({real}), not an older checkpoint")
        elif op == "restore":
            wrong = payload_mismatches(got.value.state, step, backend)
            if wrong:
                problems.append(f"{where} read back step {step} wrong: {wrong}")
    assert not problems, "\n".join(problems)
