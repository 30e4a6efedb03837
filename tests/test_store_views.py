"""The five ``dp-ckpt`` commands written once over a store view say the same
of the same checkpoints, whether they lie in a directory or, synced, on
object storage (the in-process ``memory://`` storage)."""

from __future__ import annotations

import json

import pytest
from helpers import make_payload, open_manager

from dp_ckpt_plugin.commands import main

STEPS = (1, 2, 3, 4)


@pytest.fixture
def both(tmp_path, mem, capsys):
    """A store directory with STEPS committed, and the same store synced to ``mem``."""
    directory = tmp_path / "models"
    with open_manager(directory, max_keep=0) as manager:
        for step in STEPS:
            manager.save(step, make_payload(step), metrics={"loss": 1.0 / step})
    assert main(["sync", str(directory), mem.url]) == 0
    capsys.readouterr()
    return str(directory), mem.url


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def as_json(capsys, *argv):
    status, out, _ = run(capsys, *argv, "--json")
    return status, json.loads(out)


def test_ls_lists_the_same_checkpoints(both, capsys):
    seen = []
    for store in both:
        status, data = as_json(capsys, "ls", store)
        assert status == 0
        seen.append(
            [
                (
                    f["prefix"],
                    [
                        (
                            c["name"],
                            c["step"],
                            c["size"],
                            c["digest"],
                            c["metrics"],
                            c["published"],
                            c["path"].startswith(f"{store}/")
                            and c["path"].endswith(f"/{c['name']}"),
                        )
                        for c in f["checkpoints"]
                    ],
                )
                for f in data["families"]
            ]
        )
        status, out, _ = run(capsys, "ls", store)
        assert status == 0 and "model.ckpt-4.h5  <- latest" in out
    assert seen[0] == seen[1]
    assert [c[1] for c in seen[0][0][1]] == list(STEPS)
    assert [c[5] for c in seen[0][0][1]] == [False, False, False, True]


def test_verify_finds_the_same_checkpoints_sound(both, capsys):
    seen = []
    for store in both:
        status, data = as_json(capsys, "verify", store)
        assert status == 0 and data["ok"] and data["sound"] == len(STEPS)
        assert data["hashed_bytes"] == sum(c["size"] for c in data["checkpoints"])
        seen.append(
            [(c["name"], c["step"], c["size"], c["ok"]) for c in data["checkpoints"]]
        )
        status, out, _ = run(capsys, "verify", store, "--size-only")
        assert status == 0
        assert out.splitlines()[-1] == (
            f"{len(STEPS)} of {len(STEPS)} checkpoint(s) sound (size); 0 problem(s); "
            "content not read (--size-only)"
        )
    assert seen[0] == seen[1]


def test_resolve_and_show_find_the_same_checkpoint(both, capsys):
    seen, lines = [], []
    for store in both:
        status, data = as_json(capsys, "resolve", "latest", "--dir", store)
        assert status == 0 and data["path"].startswith(f"{store}/")
        assert data["path"].endswith("/model.ckpt-4.h5")
        seen.append(
            {
                k: data[k]
                for k in (
                    "name",
                    "step",
                    "family",
                    "size",
                    "digest",
                    "created",
                    "format",
                    "metrics",
                    "committed",
                    "provenance",
                    "input",
                    "fell_back",
                    "warnings",
                )
            }
        )
        status, out, _ = run(capsys, "show", store)
        assert status == 0
        lines.append(
            [
                line
                for line in out.splitlines()
                if not line.startswith(("checkpoint ", "found by ", "checked "))
            ]
        )
    assert seen[0] == seen[1]
    assert seen[0]["step"] == STEPS[-1]
    assert lines[0] == lines[1]


def test_inspect_sees_the_same_payload(both, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DP_CKPT_STAGING", str(tmp_path / "cache"))
    seen = []
    for store in both:
        status, out, _ = run(capsys, "resolve", "latest", "--dir", store, "--path")
        assert status == 0
        status, data = as_json(capsys, "inspect", out.strip())
        assert status == 0 and data["record"] == "ok" and data["loaded"]
        assert data["url"] == (out.strip() if "://" in store else None)
        seen.append({k: v for k, v in data.items() if k not in ("path", "url")})
    assert seen[0] == seen[1]


def test_prune_removes_the_same_checkpoints(both, capsys):
    plans = []
    for store in both:
        status, data = as_json(
            capsys, "prune", store, "--keep-last", "2", "--keep-best", "0", "--dry-run"
        )
        assert status == 0
        # what keeps each, not why: a directory records a policy and has an
        # alias, HEAD neither
        plans.append(
            [
                (
                    f["prefix"],
                    f["removed"],
                    [
                        (k["name"], [p["policy"] for p in k["kept_by"]])
                        for k in f["kept"]
                    ],
                )
                for f in data["families"]
            ]
        )
        status, out, _ = run(
            capsys, "prune", store, "--keep-last", "2", "--keep-best", "0"
        )
        assert status == 0 and out.splitlines()[-1].startswith(
            "removed 2 checkpoint(s)"
        )
        _, data = as_json(capsys, "ls", store)
        assert [c["step"] for c in data["families"][0]["checkpoints"]] == [3, 4]
    assert plans[0] == plans[1]
    assert plans[0][0][1] == ["model.ckpt-1.h5", "model.ckpt-2.h5"]


def test_an_option_of_one_kind_of_store_is_refused_for_the_other(both, capsys):
    """``--release-lease`` is for a store on object storage, ``--archives`` for
    a directory: each refused in one line for the other, nothing removed."""
    directory, url = both
    for argv, message in (
        (["prune", directory, "--release-lease"], "--release-lease is for a store"),
        (["prune", url, "--archives", "--keep-archives", "0"], "--archives prunes"),
    ):
        status, out, err = run(capsys, *argv)
        assert status == 2 and out == "" and err.count("\n") == 1
        assert message in err
    for store in both:
        _, data = as_json(capsys, "ls", store)
        assert [c["step"] for c in data["families"][0]["checkpoints"]] == list(STEPS)
