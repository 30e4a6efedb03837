"""End to end: plain deepmd-kit reads what the plugin wrote, every reader, both backends.

Every file the plugin writes where deepmd-kit also reads is in deepmd-kit's
own format: the pointers (one line, no newline, relative to the pointer's
directory), the aliases (relative symlinks), the payloads. The test is
generated: each reader of deepmd-kit (``DP_CKPT_DISABLE=1``: ``train
--restart``, ``--init-model``, ``freeze`` in the working directory and with
``-c``, ``change-bias``) runs on a store the plugin wrote, for each backend
(``--pt``, ``--pt-expt``) and each layout (with ``save_dir: models``,
without). One trained store per backend and layout is shared (the plugin's
with ``save_dir`` is the run's shared training of the backend, see
``conftest.py``); every reader works on a copy.

The bytes are compared with what plain deepmd-kit writes for the same input
(one plain run per backend, with ``save_dir``); without ``save_dir`` the
plugin leaves deepmd-kit's own pointer and alias to deepmd-kit.

Run with ``pytest tests/test_e2e_interop.py -s`` to see the wall time of each command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from e2e_support import (
    E2E_MARKS,
    RESUMING,
    SHARED_FRAMES,
    copy_tree,
    dp,
    dp_env,
    example_config,
    make_data,
    make_workdir,
    payload_structure,
    run,
    shared_config,
    unmatched_variables,
    write_config,
)

pytestmark = E2E_MARKS

BACKENDS = ("pt", "pt-expt")
LAYOUTS = ("save_dir", "flat")
STEPS = 10
TRAINING = {"numb_steps": STEPS, "save_freq": 5, "disp_freq": 5, "max_ckpt_keep": 2}
FROZEN = {"pt": ".pth", "pt-expt": ".pte"}
PLAIN = dp_env(DP_CKPT_DISABLE="1")


def config(layout: str, **changes):
    save_dir = "models" if layout == "save_dir" else None
    return example_config(**{**TRAINING, "save_dir": save_dir, **changes})


def store_dir(workdir: Path, layout: str) -> Path:
    return workdir / "models" if layout == "save_dir" else workdir


#: deepmd-kit's readers: what each runs (``{store}`` is ``models`` or ``.``),
#: whether it writes into the store (then it runs on a copy), and the layouts
#: where it reads something the other readers do not.
READERS = {
    # the alias beside the save_ckpt prefix (deepmd-kit appends .pt)
    "train --restart": (["train", "input.json", "--restart", "model.ckpt"], True),
    # the alias inside the store
    "train --init-model": (
        ["train", "input.json", "--init-model", "{store}/model.ckpt.pt"],
        True,
    ),
    # dp --pt: the working directory's pointer; dp --pt-expt: its alias
    "freeze": (["freeze", "-o", "frozen"], False),
    # dp --pt: the store's pointer; dp --pt-expt: the store's alias
    "freeze -c": (["freeze", "-c", "{store}", "-o", "frozen_c"], False),
    "change-bias": (
        ["change-bias", "model.ckpt.pt", "-s", "data/valid", "-o", "updated.pt"],
        False,
    ),
}
CASES = [
    (backend, layout, reader)
    for backend in BACKENDS
    for layout in LAYOUTS
    for reader in READERS
    # without save_dir, -c . is the working directory: the same reader as freeze
    if not (layout == "flat" and reader == "freeze -c")
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_interop")


@pytest.fixture(scope="module")
def data(base):
    return make_data(base / "data_source", frames=SHARED_FRAMES)


@pytest.fixture(scope="module")
def trained(base, data, shared_trained):
    """``trained(backend, layout, plain=False)``: a working directory, trained once.

    The plugin's with ``save_dir`` is the run's shared training of the backend
    (``conftest.py``), of the same input; nothing writes into it (the readers
    run on copies).
    """
    assert config("save_dir") == shared_config()
    made = {}

    def get(backend: str, layout: str, *, plain: bool = False) -> Path:
        key = (backend, layout, plain)
        if key == (backend, "save_dir", False):
            return shared_trained(backend)
        if key not in made:
            name = f"{'plain' if plain else 'plugin'}_{backend}_{layout}"
            workdir = make_workdir(base, name, data, config(layout))
            run(
                dp("train", "input.json", backend=backend),
                workdir,
                env=PLAIN if plain else dp_env(),
                label=f"{'DP_CKPT_DISABLE=1 ' if plain else ''}dp --{backend} train "
                f"({layout})",
            ).check()
            made[key] = workdir
        return made[key]

    return get


# -- the bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_pointers_aliases_and_payload_are_deepmds_bytes(trained, backend):
    ours, theirs = (
        trained(backend, "save_dir"),
        trained(backend, "save_dir", plain=True),
    )
    name = f"model.ckpt-{STEPS}.pt"
    # deepmd-kit's working-directory pointer and alias: the same bytes
    assert (ours / "checkpoint").read_bytes() == (theirs / "checkpoint").read_bytes()
    assert (ours / "checkpoint").read_bytes() == f"models/{name}".encode()
    assert os.readlink(ours / "model.ckpt.pt") == os.readlink(theirs / "model.ckpt.pt")
    # the store's own, in the form deepmd-kit's -c D reads (D.joinpath(text))
    assert (ours / "models" / "checkpoint").read_bytes() == name.encode()
    assert os.readlink(ours / "models" / "model.ckpt.pt") == name
    assert payload_structure(ours / "models" / name) == payload_structure(
        theirs / "models" / name
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_save_dir_deepmds_own_pointer_and_alias_stay(trained, backend):
    workdir = trained(backend, "flat")
    name = f"model.ckpt-{STEPS}.pt"
    assert (workdir / "checkpoint").read_bytes() == name.encode()
    assert os.readlink(workdir / "model.ckpt.pt") == name


# -- every reader ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "layout", "reader"), CASES, ids=["-".join(c) for c in CASES]
)
def test_plain_deepmd_reads_what_the_plugin_wrote(
    base, trained, backend, layout, reader
):
    source = trained(backend, layout)
    args, writes = READERS[reader]
    store = "models" if layout == "save_dir" else "."
    args = [a.format(store=store) for a in args]
    # every reader runs on a copy: the stores are shared by the cases
    workdir = copy_tree(source, base / f"read_{backend}_{layout}_{reader[-7:]}")
    if writes:
        write_config(workdir / "input.json", config(layout, numb_steps=STEPS + 2))
    latest = store_dir(workdir, layout) / f"model.ckpt-{STEPS}.pt"
    alias = (workdir / "model.ckpt.pt").resolve()  # before a reader moves it
    result = run(
        dp(*args, backend=backend),
        workdir,
        env=PLAIN,
        label=f"DP_CKPT_DISABLE=1 dp --{backend} {' '.join(args)} ({layout})",
    ).check()
    if reader == "train --restart":
        assert RESUMING.findall(result.output) == ["model.ckpt.pt"]
        assert alias == latest.resolve()
        assert not re.search(r"Batch\s+1:", result.output)  # the count went on
        assert (store_dir(workdir, layout) / f"model.ckpt-{STEPS + 2}.pt").is_file()
    elif reader == "train --init-model":
        assert (store_dir(workdir, layout) / f"model.ckpt-{STEPS + 2}.pt").is_file()
    elif reader.startswith("freeze"):
        frozen = workdir / (args[-1] + FROZEN[backend])
        assert frozen.is_file(), result.describe()
        if backend == "pt-expt":
            assert unmatched_variables(frozen, latest) == []
    else:
        assert (workdir / "updated.pt").is_file(), result.describe()
