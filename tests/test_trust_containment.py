"""Class 4, containment (rule 31): a store touches nothing outside its directory.

``test_planted_link``: a symlink planted in the store ``D`` points outside
it, at a file or directory of an "outside" tree, in place of the lock file,
the lock's holder note, the manifest, a commit record (of the step about to
be saved, and of an existing checkpoint), the pointer, the alias,
``archive``, ``quarantine``, the numbered checkpoint about to be saved, or a
name of the store's temporary pattern (the lock and holder links also
dangling: their target does not exist) -- 13 plants -- x 3 scenarios: a new
run that archives the earlier one and saves with a window of 2; a run that
resumes from ``latest`` (the newest checkpoint damaged, so that it is
quarantined), saves and prunes; and ``dp-ckpt verify --digest``, ``prune``
and ``adopt``. 39 generated cases. Everything outside ``D`` (names, kinds,
contents, mtimes, link targets) must be as it was.

``test_other_runs_checkpoint_is_not_moved``: ``D``'s pointer (absolute or
relative) or alias names the newest checkpoint of another run's store ``E``,
whose bytes are damaged (one byte flipped, checked by digest; or truncated,
checked by size); resolving ``latest`` or the directory ``D`` may report it
and skip it, but must leave ``E`` as it was: 3 x 2 x 2 = 12 cases.

51 cases in all.
"""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import make_payload
from trust_cases import (
    HOLDER,
    LOCK,
    MANIFEST,
    POINTER,
    alias_name,
    attempt,
    ckpt_name,
    cli,
    cli_problems,
    clone,
    flip_payload_byte,
    manager,
    record_of,
    tree_changes,
    tree_state,
    truncate,
)

#: name in D -> (what the link's target outside is: "file", "dir" or None, absent)
PLANTS = {
    "lock": (LOCK, "file"),
    "lock-dangling": (LOCK, None),
    "holder": (HOLDER, "file"),
    "holder-dangling": (HOLDER, None),
    "manifest": (MANIFEST, "file"),
    "new-record": (record_of(".", 4).name, "file"),
    "old-record": (record_of(".", 1).name, "record"),
    "pointer": (POINTER, "pointer"),
    "alias": (alias_name(), "payload"),
    "archive": ("archive", "dir"),
    "quarantine": ("quarantine", "dir"),
    "numbered": (ckpt_name(4), "payload"),
    "temporary": (f".{ckpt_name(4)}.tmp-{os.getpid()}-0badc0de", "file"),
}
SCENARIOS = ("new-run", "resume", "commands")


def plant(store, outside, plant_name):
    """Replace ``store/<name>`` by a symlink to a thing in ``outside``."""
    name, kind = PLANTS[plant_name]
    target = outside / f"target-of-{plant_name}"
    if kind == "file":
        target.write_text("outside, not the store's\n")
    elif kind == "dir":
        target.mkdir()
        (target / "keep.txt").write_text("outside, not the store's\n")
    elif kind == "record":
        shutil.copyfile(store / name, target)
    elif kind == "pointer":
        target.write_text(ckpt_name(3) + "\n")
    elif kind == "payload":
        shutil.copyfile(store / ckpt_name(3), target)
    link = store / name
    if os.path.lexists(link):
        link.unlink()
    os.symlink(target, link)


def run_scenario(store, scenario):
    """Run what ``scenario`` says on ``store``; return the problems on the way."""
    problems = []
    if scenario == "commands":
        for argv in (
            ("verify", store, "--digest", "--json"),
            ("prune", store, "--keep-last", "1"),
            ("adopt", store),
        ):
            run = cli(*argv)
            problems += [f"{run}: {p}" for p in cli_problems(run)]
        return problems
    m = manager(store, verify="digest", max_keep=2)
    try:
        if scenario == "resume":
            flip_payload_byte(store / ckpt_name(3), 3)
            got = attempt(m.restore, "latest")
            if got.kind == "crash":
                problems.append(f"restore('latest'): {got}")
        for step in (4, 5):
            saved = attempt(m.save, step, make_payload(step))
            if saved.kind == "crash":
                problems.append(f"save({step}): {saved}")
    finally:
        closed = attempt(m.close)
        if closed.kind == "crash":
            problems.append(f"close(): {closed}")
    return problems


def outside_state(root, store):
    """Everything under ``root`` but the store ``store``."""
    state = tree_state(root)
    inside = str(store.relative_to(root))
    return {
        k: v
        for k, v in state.items()
        if k != inside and not k.startswith(inside + os.sep)
    }


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("plant_name", list(PLANTS))
def test_planted_link(tmp_path, plant_name, scenario):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "bystander.txt").write_text("nothing to do with checkpoints\n")
    store = clone(tmp_path / "D")
    plant(store, outside, plant_name)
    before = outside_state(tmp_path, store)
    problems = run_scenario(store, scenario)
    changes = tree_changes(before, outside_state(tmp_path, store))
    problems += [f"outside the store: {c}" for c in changes]
    assert not problems, "\n".join(problems)


LINKS = ("pointer-absolute", "pointer-relative", "alias")
DAMAGES = [("flip", "digest"), ("truncate", "size")]


@pytest.mark.parametrize("spec", ["latest", "directory"])
@pytest.mark.parametrize(("damage", "verify"), DAMAGES)
@pytest.mark.parametrize("link", LINKS)
def test_other_runs_checkpoint_is_not_moved(tmp_path, link, damage, verify, spec):
    other = clone(tmp_path / "E")
    newest = other / ckpt_name(3)
    if damage == "flip":
        flip_payload_byte(newest, 3)
    else:
        truncate(newest)
    store = tmp_path / "D"
    store.mkdir()
    if link == "pointer-absolute":
        (store / POINTER).write_text(f"{newest}\n")
    elif link == "pointer-relative":
        (store / POINTER).write_text(f"{os.path.relpath(newest, store)}\n")
    else:
        os.symlink(newest, store / alias_name())
    before = tree_state(other)
    m = manager(store, verify=verify, max_keep=0)
    try:
        got = attempt(m.restore, "latest" if spec == "latest" else str(store))
    finally:
        m.close()
    problems = [f"restore: {got}"] if got.kind == "crash" else []
    if got.kind == "ok":
        problems.append(f"restore handed back {got.value.path}, damaged")
    problems += [
        f"in the other run's store: {c}"
        for c in tree_changes(before, tree_state(other))
    ]
    assert not problems, "\n".join(problems)
