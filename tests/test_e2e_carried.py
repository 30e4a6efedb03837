"""End to end, rule 50: a checkpoint without a commit record is checked by its own checksums.

dflow-based tools hand a model to the next iteration by ``os.link`` of a
checkpoint of a trained store into another directory, where it has no
record. ``dp --pt train --init-model <that link>`` checks it by the CRC32 of
every member of its zip archive: intact, one INFO line says so (no
WARNING); damaged, ``dp`` ends with one line naming the member, before
anything is built, and no traceback (``dp --pt freeze -c`` of it too).
"""

from __future__ import annotations

import os
import re

import pytest
from e2e_support import (
    E2E_MARKS,
    assert_no_traceback,
    dp,
    example_config,
    make_workdir,
    run,
)
from helpers import flipped, zip_member_spans

pytestmark = E2E_MARKS

#: The next iteration's input: two steps from the handed model.
NEXT = {"numb_steps": 2, "save_freq": 2, "disp_freq": 1}


@pytest.fixture
def handed(shared_trained, tmp_path):
    """``(workdir, model)``: a new run's directory and the trained model
    hard-linked into it (the shared store is never changed)."""
    trained = shared_trained("pt")
    workdir = make_workdir(tmp_path, "next", trained / "data", example_config(**NEXT))
    model = workdir / "from_last_iteration" / "model.ckpt-10.pt"
    model.parent.mkdir()
    os.link(trained / "models" / "model.ckpt-10.pt", model)
    return workdir, model


def test_a_linked_checkpoint_is_checked_by_its_crc32(handed):
    workdir, model = handed
    spec = "from_last_iteration/model.ckpt-10.pt"
    result = run(dp("train", "input.json", "--init-model", spec, backend="pt"), workdir)
    result.check()
    out = result.output
    members = len(zip_member_spans(model.read_bytes()))
    line = (
        f"--init-model {spec}: {spec} (step 10), named explicitly; no commit "
        f"record; the CRC32 of all {members} members of its zip archive match"
    )
    assert re.search(r" INFO .*" + re.escape(line), out), out[-3000:]
    assert "could not be verified" not in out
    assert not [x for x in out.splitlines() if "WARNING" in x and "record" in x]


@pytest.mark.parametrize(
    "command", [("train", "input.json", "--init-model"), ("freeze", "-c")]
)
def test_a_damaged_one_ends_in_one_line_before_anything_is_built(handed, command):
    workdir, model = handed
    data = model.read_bytes()
    model.unlink()  # never write through the link: the shared store stays whole
    name, start, size = next(
        s for s in zip_member_spans(data) if s[0].endswith("data.pkl")
    )
    model.write_bytes(flipped(data, start + size // 2))
    spec = "from_last_iteration/model.ckpt-10.pt"
    result = run(dp(*command, spec, backend="pt"), workdir)
    assert result.returncode == 1, result.describe()
    assert_no_traceback(result)
    errors = [x for x in result.output.splitlines() if " ERROR " in x]
    assert len(errors) == 1, result.output[-3000:]
    assert f"member {name} of its zip archive fails its check" in errors[0]
    assert "Constructing DataLoaders" not in result.output  # nothing built
    assert not (workdir / "models").exists()
    assert not list(workdir.glob("frozen_model*"))
