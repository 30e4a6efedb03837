"""The ``dp-ckpt`` command on stores written through the API (the real ``dp`` is in
``test_e2e_commands.py``): ``ls``, ``show``, ``verify``, ``prune``, their JSON,
and user mistakes that end with one line and exit status 2 or 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import make_payload, open_manager

from dp_ckpt_plugin import get_plugin_manager
from dp_ckpt_plugin.checkpoint.layout import MANIFEST_NAME
from dp_ckpt_plugin.checkpoint.records import record_path
from dp_ckpt_plugin.commands import main, one_line
from dp_ckpt_plugin.resolution.quarantine import quarantine
from dp_ckpt_plugin.storage import local_storage
from dp_ckpt_plugin.store.lock import StoreLock

POLICY = {
    "keep_last": 2,
    "keep_every_n_steps": 4,
    "keep_best": 1,
    "best_metric": "loss",
}
LOSSES = {1: 0.9, 2: 0.3, 3: 0.5, 4: 0.8, 5: 0.1, 6: 0.6, 7: 0.7, 8: 0.4, 9: 0.2}


def fill(directory, policy=POLICY, losses=LOSSES, **kwargs):
    """A store written through the API, each checkpoint with its loss."""
    m = open_manager(directory, policy=policy, **kwargs)
    try:
        return {
            step: m.save(step, make_payload(step), metrics={"loss": loss})
            for step, loss in losses.items()
        }
    finally:
        m.close()


def dp_ckpt(capsys, *args):
    """Run ``dp-ckpt args``; return (status, stdout, stderr)."""
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def as_json(capsys, *args):
    status, out, _ = dp_ckpt(capsys, *args, "--json")
    return status, json.loads(out)


@pytest.fixture
def store(tmp_path):
    d = tmp_path / "models"
    fill(d)
    return d


# -- ls -----------------------------------------------------------------------------


def test_ls_says_which_policy_keeps_each_file(store, capsys):
    status, out, err = dp_ckpt(capsys, "ls", store)
    assert status == 0 and err == ""
    assert "kept by: newest 2 or every 4 steps or best 1 by loss (lowest)" in out
    lines = {
        line.split()[1]: line for line in out.splitlines() if "model.ckpt-" in line
    }
    assert sorted(lines) == [f"model.ckpt-{s}.h5" for s in (4, 5, 8, 9)]
    assert lines["model.ckpt-4.h5"].endswith("every 4 steps")
    assert lines["model.ckpt-5.h5"].endswith("best 1 by loss (lowest)")
    assert lines["model.ckpt-8.h5"].endswith("newest 2; every 4 steps")
    assert lines["model.ckpt-9.h5"].endswith("latest (pointer, alias)")
    assert "loss=0.1" in lines["model.ckpt-5.h5"]
    assert all(line == line.rstrip() for line in out.splitlines())


def test_ls_json(store, capsys):
    status, data = as_json(capsys, "ls", store)
    assert status == 0
    assert data["version"] == 1 and data["format"] == "hdf5" and data["manifest"]
    (family,) = data["families"]
    assert family["prefix"] == "model.ckpt" and family["latest"] == "model.ckpt-9.h5"
    assert family["policy"] == {**POLICY, "best_mode": "min"}
    by = {c["step"]: c for c in family["checkpoints"]}
    assert sorted(by) == [4, 5, 8, 9]
    assert by[5]["kept_by"] == [
        {"policy": "keep_best", "reason": "best 1 by loss (lowest)"}
    ]
    assert by[9]["kept_by"] == [
        {"policy": "protected", "reason": "latest (pointer, alias)"}
    ]
    assert by[5]["metrics"] == {"loss": 0.1}
    assert all(c["kept"] for c in family["checkpoints"])
    assert data["uncommitted"] == data["quarantine"] == data["archive"] == []


def test_ls_says_what_goes_at_the_next_save(store, capsys):
    manifest = json.loads((store / MANIFEST_NAME).read_text())
    # the key a manifest of dp-ckpt-plugin 0.2 holds
    manifest["families"][0]["policy"] = {"max_ckpt_keep": 1}
    (store / MANIFEST_NAME).write_text(json.dumps(manifest))
    _, data = as_json(capsys, "ls", store)
    kept = {c["step"]: c["kept"] for c in data["families"][0]["checkpoints"]}
    assert kept == {4: False, 5: False, 8: False, 9: True}
    _, out, _ = dp_ckpt(capsys, "ls", store)
    assert "goes at the next save" in out


def test_ls_without_a_manifest_finds_families_by_their_records(store, capsys):
    (store / MANIFEST_NAME).unlink()
    status, data = as_json(capsys, "ls", store)
    assert status == 0 and not data["manifest"] and data["format"] == "hdf5"
    (family,) = data["families"]
    assert family["policy"] is None
    by = {c["step"]: c for c in family["checkpoints"]}
    assert by[9]["kept"] is True and by[4]["kept"] is None
    _, out, _ = dp_ckpt(capsys, "ls", store)
    assert "kept by: unknown (no manifest)" in out and "? (policy unknown)" in out


def test_ls_of_a_store_written_without_the_plugin(tmp_path, capsys):
    d = tmp_path / "plain"
    d.mkdir()
    for step in (10, 20):
        (d / f"model.ckpt-{step}.pt").write_bytes(b"x" * step)
    (d / "checkpoint").write_text("model.ckpt-20.pt\n")
    status, data = as_json(capsys, "ls", d)
    assert status == 0
    assert data["families"][0]["prefix"] == "model.ckpt"
    assert data["families"][0]["checkpoints"] == []
    assert [(u["name"], u["problem"]) for u in data["uncommitted"]] == [
        ("model.ckpt-10.pt", "no commit record"),
        ("model.ckpt-20.pt", "no commit record"),
    ]


def test_ls_lists_quarantine_and_archive(tmp_path, capsys):
    d = tmp_path / "models"
    paths = fill(d, {"keep_last": 3}, {1: 0.5, 2: 0.4, 3: 0.3})
    with open(paths[3], "r+b") as handle:
        handle.truncate(10)
    with open_manager(d, max_keep=3) as m:
        assert m.resolve("latest") == paths[2]  # 3 moved aside
    with open_manager(d, max_keep=3) as m:
        m.save(1, make_payload(1))  # a fresh run: the earlier one is archived
    _, data = as_json(capsys, "ls", d)
    assert [q["name"].split(".h5")[0] for q in data["quarantine"]] == ["model.ckpt-3"]
    (archived,) = data["archive"]
    assert sorted(archived["checkpoints"]) == ["model.ckpt-1.h5", "model.ckpt-2.h5"]
    _, out, _ = dp_ckpt(capsys, "ls", d, "--all")
    assert "quarantine/: 1 file(s)" in out and "archive/: 1 earlier run(s)" in out
    assert "model.ckpt-1.h5, model.ckpt-2.h5" in out


def test_ls_reports_files_that_are_not_committed(store, capsys):
    (store / "model.ckpt-10.h5").write_bytes(b"no record")
    record = record_path(store / "model.ckpt-8.h5")
    record.write_text("{not json")
    _, data = as_json(capsys, "ls", store)
    problems = {u["name"]: u["problem"] for u in data["uncommitted"]}
    assert problems["model.ckpt-10.h5"] == "no commit record"
    assert problems["model.ckpt-8.h5"].startswith("malformed commit record")
    steps = [c["step"] for c in data["families"][0]["checkpoints"]]
    assert steps == [4, 5, 9]


def test_ls_shows_a_checkpoint_cut_short_by_its_size(store, capsys):
    path = store / "model.ckpt-8.h5"
    full = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(full // 2)
    status, out, _ = dp_ckpt(capsys, "ls", store)
    (row,) = [line for line in out.splitlines() if "model.ckpt-8.h5" in line]
    assert status == 0
    assert f"{full // 2 / 1000:.1f} kB of {full / 1000:.1f} kB" in row
    assert f"CUT SHORT (its record says {full} bytes)" in row
    _, data = as_json(capsys, "ls", store)
    found = {c["name"]: c for c in data["families"][0]["checkpoints"]}
    assert found["model.ckpt-8.h5"]["torn"] is True
    assert found["model.ckpt-8.h5"]["size_on_disk"] == full // 2
    assert found["model.ckpt-9.h5"]["torn"] is False


def test_ls_says_in_one_line_that_a_family_has_no_checkpoints(tmp_path, capsys):
    from helpers import make_store

    from dp_ckpt_plugin.checkpoint.manifest import read_manifest

    d = tmp_path / "models"
    with make_store(get_plugin_manager(), d) as store:  # EMA family, never saved
        store.save(1, make_payload(1))
    assert len(read_manifest(d).families) == 2
    status, out, _ = dp_ckpt(capsys, "ls", d)
    assert status == 0
    (line,) = [line for line in out.splitlines() if "model_ema.ckpt" in line]
    assert line.endswith(": no committed checkpoints")
    assert out.count(" step ") == 1  # one table
    _, out, _ = dp_ckpt(capsys, "ls", d, "--all")
    assert out.count(" step ") == 2  # the empty table, asked for


# -- show ---------------------------------------------------------------------------


def test_show_latest_best_and_a_file(store, capsys):
    status, data = as_json(capsys, "show", store)
    assert status == 0
    assert (data["name"], data["step"], data["checked"]) == (
        "model.ckpt-9.h5",
        9,
        "size",
    )
    assert data["how"] == f"pointer {store / 'checkpoint'}"
    status, data = as_json(capsys, "show", store, "best", "--digest")
    assert (data["name"], data["checked"]) == ("model.ckpt-5.h5", "digest")
    assert data["metrics"] == {"loss": 0.1}
    status, data = as_json(capsys, "show", store, store / "model.ckpt-4.h5")
    assert data["step"] == 4 and data["committed"]
    status, out, _ = dp_ckpt(capsys, "show", store, "best")
    assert "best 1 by loss (lowest)" in out and "model.ckpt-5.h5" in out


def test_show_moves_nothing(store, capsys):
    with open(store / "model.ckpt-9.h5", "r+b") as handle:
        handle.truncate(10)
    _, data = as_json(capsys, "show", store)
    assert data["step"] == 8
    assert any("model.ckpt-9.h5" in w for w in data["warnings"])
    assert (store / "model.ckpt-9.h5").exists()
    assert not (store / "quarantine").exists()


def test_show_says_each_warning_once(store, capsys, caplog):
    """The core returns its warnings; ``show`` prints each once (none logged)."""
    with open(store / "model.ckpt-9.h5", "r+b") as handle:
        handle.truncate(10)
    with caplog.at_level("WARNING"):
        status, out, err = dp_ckpt(capsys, "show", store)
    assert status == 0
    said = (out + err + caplog.text).count("model.ckpt-9.h5 has 10 bytes")
    assert said == 1, out + err + caplog.text


def test_show_of_nothing_is_one_line_and_status_1(store, capsys):
    status, out, err = dp_ckpt(capsys, "show", store, "no-such-file")
    assert status == 1 and out == ""
    assert err.startswith(
        "dp-ckpt: error: no checkpoint found for restart 'no-such-file'"
    )
    assert err.count("\n") == 1


# -- verify -------------------------------------------------------------------------


def test_verify_a_sound_store(store, capsys):
    """The content is checked by default; the summary says what was hashed, how fast."""
    status, out, err = dp_ckpt(capsys, "verify", store)
    assert status == 0 and err == ""
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("4 of 4 checkpoint(s) sound (size, digest); 0 problem(s)")
    total = sum(p.stat().st_size for p in store.glob("model.ckpt-*.h5"))
    assert re.search(r"; hashed \d[\d.]* (B|kB|MB) in \d+\.\d\d s \(.+/s\)$", summary)
    status, data = as_json(capsys, "verify", store)
    assert status == 0 and data["ok"] and data["checked"] == "digest"
    assert data["hashed_bytes"] == total and data["seconds"] >= 0
    assert [c["step"] for c in data["checkpoints"]] == [4, 5, 8, 9]
    status, out, _ = dp_ckpt(capsys, "verify", store, "--size-only")
    assert status == 0
    assert "4 of 4 checkpoint(s) sound (size); 0 problem(s); content not read" in out
    status, data = as_json(capsys, "verify", store, "--size-only")
    assert data["checked"] == "size" and data["hashed_bytes"] == 0


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("flag", [(), ("--digest",)], ids=str)
def test_verify_finds_a_flipped_byte_unless_asked_for_sizes_only(store, capsys, flag):
    flip_a_byte(store / "model.ckpt-8.h5")
    assert dp_ckpt(capsys, "verify", store, "--size-only")[0] == 0
    status, data = as_json(capsys, "verify", store, *flag)
    assert status == 1 and not data["ok"]
    (bad,) = [c for c in data["checkpoints"] if not c["ok"]]
    assert bad["name"] == "model.ckpt-8.h5" and "digest" in bad["problem"]
    status, out, _ = dp_ckpt(capsys, "verify", store, *flag)
    assert "CORRUPT" in out and "1 problem(s)" in out
    assert (store / "model.ckpt-8.h5").exists()  # reported, never moved


@pytest.mark.parametrize("command", ["verify", "inspect", "resolve", "check"])
def test_sha256_is_refused_in_one_line_naming_digest(store, capsys, command):
    status, out, err = dp_ckpt(capsys, command, store, "--sha256")
    assert status == 2 and out == ""
    assert "--sha256 is --digest" in err and err.count("\n") == 1


def test_verify_size_only_and_digest_are_exclusive(store, capsys):
    status, _, err = dp_ckpt(capsys, "verify", store, "--size-only", "--digest")
    assert status == 2 and "not allowed with argument" in err
    assert err.count("\n") == 1


#: Run ``dp-ckpt verify`` with its progress threshold set by the first argument.
_VERIFY_ON_A_TERMINAL = """
import sys
from dp_ckpt_plugin.commands import main, verify
verify.PROGRESS_ABOVE = int(sys.argv[1])
sys.exit(main(sys.argv[2:]))
"""


def _verify_on_a_terminal(threshold: int, *args) -> tuple[int, str, bytes]:
    """``dp-ckpt verify`` with standard error on a terminal; (status, stdout, stderr)."""
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _VERIFY_ON_A_TERMINAL, str(threshold), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode()
    os.close(leader)
    return proc.wait(timeout=60), out, seen


def test_verify_shows_a_progress_bar_on_a_terminal_for_a_large_store(store):
    """Above the threshold: a bar on the terminal's stderr; --json stays clean."""
    from dp_ckpt_plugin.commands.verify import PROGRESS_ABOVE

    assert PROGRESS_ABOVE >= 100 << 20  # "a few hundred MiB"
    status, out, err = _verify_on_a_terminal(1, "verify", store)
    assert status == 0 and "hashing" in err.decode(errors="replace")
    assert "4 of 4 checkpoint(s) sound" in out and "\x1b" not in out
    status, out, err = _verify_on_a_terminal(1, "verify", store, "--json")
    assert status == 0 and json.loads(out)["ok"] and b"hashing" not in err
    status, out, err = _verify_on_a_terminal(PROGRESS_ABOVE, "verify", store)
    assert status == 0 and b"hashing" not in err  # a small store: no bar


def test_verify_finds_a_torn_file_malformed_record_and_dangling_pointer(store, capsys):
    with open(store / "model.ckpt-4.h5", "r+b") as handle:
        handle.truncate(100)
    record_path(store / "model.ckpt-5.h5").write_text("[]")
    (store / "model.ckpt-9.h5").unlink()
    status, data = as_json(capsys, "verify", store)
    assert status == 1
    text = "\n".join(data["problems"])
    assert "model.ckpt-4.h5 has 100 bytes" in text
    assert "model.ckpt-5.h5: malformed commit record" in text
    assert "pointer" in text and "names model.ckpt-9.h5" in text


def test_verify_one_file(store, capsys):
    assert dp_ckpt(capsys, "verify", store / "model.ckpt-5.h5", "--digest")[0] == 0
    flip_a_byte(store / "model.ckpt-5.h5")
    assert dp_ckpt(capsys, "verify", store / "model.ckpt-5.h5", "--digest")[0] == 1
    plain = store.parent / "plain.pt"
    plain.write_bytes(b"x")
    status, data = as_json(capsys, "verify", plain)
    assert status == 1 and "no commit record" in data["problems"][0]


def test_verify_with_nothing_to_verify_fails(tmp_path, capsys):
    (tmp_path / "model.ckpt-1.pt").write_bytes(b"x")
    (tmp_path / "checkpoint").write_text("model.ckpt-1.pt")
    status, out, _ = dp_ckpt(capsys, "verify", tmp_path)
    assert status == 1
    assert "nothing to verify" in out and "1 file(s) without a commit record" in out


# -- prune --------------------------------------------------------------------------


def on_disk(directory):
    return sorted(int(p.name[11:-3]) for p in directory.glob("model.ckpt-*.h5"))


def test_prune_dry_run_removes_nothing(store, capsys):
    status, data = as_json(
        capsys, "prune", store, "--dry-run", "--keep-last", "1", "--keep-best", "0"
    )
    assert status == 0 and data["dry_run"]
    (family,) = data["families"]
    assert family["removed"] == ["model.ckpt-5.h5"]  # 4 and 8: every 4 steps
    assert family["policy"] == {"keep_last": 1, "keep_every_n_steps": 4}
    assert on_disk(store) == [4, 5, 8, 9]


def test_prune_removes_what_the_policy_does_not_keep(store, capsys):
    status, out, _ = dp_ckpt(
        capsys, "prune", store, "--keep-last", "none", "--keep-every-n-steps", "0"
    )
    assert status == 0
    assert "policy: best 1 by loss (lowest)" in out
    assert "removed 2 checkpoint(s)" in out
    assert on_disk(store) == [5, 9]
    # payload and record both gone; nothing but the kept records left
    records = sorted(p.name for p in store.glob(".model.ckpt-*.commit.json"))
    assert records == [".model.ckpt-5.h5.commit.json", ".model.ckpt-9.h5.commit.json"]
    assert not (store / "quarantine").exists()
    # the recorded policy (the writer's) is as it was
    assert (
        json.loads((store / MANIFEST_NAME).read_text())["families"][0]["policy"][
            "keep_last"
        ]
        == 2
    )


def test_prune_uses_the_recorded_policy(tmp_path, capsys):
    d = tmp_path / "models"
    fill(d, {"keep_last": 0})
    manifest = json.loads((d / MANIFEST_NAME).read_text())
    manifest["families"][0]["policy"] = {"keep_last": 3}
    (d / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert dp_ckpt(capsys, "prune", d)[0] == 0
    assert on_disk(d) == [7, 8, 9]


def test_prune_is_refused_while_a_run_holds_the_store(store, capsys):
    lock = StoreLock(store)
    lock.acquire()
    try:
        status, out, err = dp_ckpt(capsys, "prune", store, "--keep-last", "1")
    finally:
        lock.release()
    assert status == 1 and out == ""
    assert "is in use by another run" in err and err.count("\n") == 1
    assert on_disk(store) == [4, 5, 8, 9]
    assert dp_ckpt(capsys, "prune", store, "--dry-run", "--keep-last", "1")[0] == 0


def test_prune_without_a_known_policy_asks_for_one(store, capsys):
    (store / MANIFEST_NAME).unlink()
    status, _, err = dp_ckpt(capsys, "prune", store)
    assert status == 2 and "give one, such as --keep-last 5" in err
    assert on_disk(store) == [4, 5, 8, 9]


# -- resolve ---------------------------------------------------------------------------


def test_resolve_takes_the_spec_first_and_the_store_from_dir(store, capsys):
    status, data = as_json(capsys, "resolve", "latest", "--dir", store)
    assert status == 0 and data["name"] == "model.ckpt-9.h5"
    assert data["how"].startswith("pointer") and data["checked"] == "size"
    _, shown = as_json(capsys, "show", store, "latest")
    assert shown == data  # show is the same code, store first
    status, data = as_json(capsys, "resolve", "best", "--dir", store, "--digest")
    assert status == 0 and data["name"] == "model.ckpt-5.h5"


def test_resolve_uses_the_working_directory_by_default(store, capsys, monkeypatch):
    monkeypatch.chdir(store)
    status, out, err = dp_ckpt(capsys, "resolve", "latest")
    assert status == 0 and err == ""
    assert "model.ckpt-9.h5" in out and "found by" in out


@pytest.mark.parametrize("spec", ["latest", "best", "models/model.ckpt-4.h5"])
def test_resolve_path_prints_the_path_alone(store, capsys, monkeypatch, spec):
    monkeypatch.chdir(store.parent)
    status, out, err = dp_ckpt(capsys, "resolve", spec, "--dir", store, "--path")
    assert status == 0 and err == ""
    (line,) = out.splitlines()
    assert Path(line).is_absolute() and Path(line).is_file()
    expected = {"latest": 9, "best": 5}.get(spec, 4)
    assert line == str(store / f"model.ckpt-{expected}.h5")


def test_resolve_path_of_nothing_is_one_line_on_stderr(store, capsys):
    status, out, err = dp_ckpt(capsys, "resolve", store / "nope", "--path")
    assert (status, out) == (1, "")
    assert len(err.splitlines()) == 1 and err.startswith("dp-ckpt: error: ")


def test_resolve_path_says_warnings_on_stderr(store, capsys):
    (store / "model.ckpt-9.h5").write_bytes(b"torn")  # the newest, torn
    status, out, err = dp_ckpt(capsys, "resolve", "latest", "--dir", store, "--path")
    assert status == 0 and out == f"{store / 'model.ckpt-8.h5'}\n"
    assert err.startswith("dp-ckpt: warning: ") and "model.ckpt-9.h5" in err


@pytest.mark.parametrize(
    ("spec", "close"),
    [
        ("lastest", "latest"),
        ("latset", "latest"),
        ("bset", "best"),
        ("modles", "models"),
        ("models/model.ckpt-9.h6", "models/model.ckpt-9.h5"),
        ("models/modle.ckpt", "models/model.ckpt"),
    ],
)
def test_a_mistyped_handle_gets_a_suggestion(store, capsys, monkeypatch, spec, close):
    monkeypatch.chdir(store.parent)
    status, _, err = dp_ckpt(capsys, "resolve", spec, "--dir", store, "--path")
    assert status == 1
    assert f"(did you mean {close}?)" in err


@pytest.mark.parametrize("spec", ["elsewhere", "models/model.ckpt-99.h5", "empty"])
def test_no_suggestion_for_a_name_that_exists_or_has_no_neighbour(
    store, capsys, monkeypatch, spec
):
    monkeypatch.chdir(store.parent)
    (store.parent / "empty").mkdir()
    status, _, err = dp_ckpt(capsys, "resolve", spec, "--dir", store)
    assert status == 1 and "did you mean" not in err


# -- inspect ---------------------------------------------------------------------------


def test_inspect_an_hdf5_checkpoint(store, capsys):
    status, data = as_json(capsys, "inspect", store / "model.ckpt-9.h5", "--digest")
    assert status == 0
    assert (data["step"], data["format"], data["record"]) == (9, "hdf5", "ok")
    assert data["digest_checked"] and data["loaded"]
    by = {e["key"]: e for e in data["entries"]}
    assert by["/"]["type"] == "dict" and by["/"]["length"] == len(make_payload(9))
    weights = make_payload(9)["weights"]
    assert by["/weights"]["shape"] == list(weights.shape)
    assert by["/weights"]["dtype"] == str(weights.dtype)
    assert by["/weights"]["bytes"] == weights.nbytes
    assert by["/step"]["type"] == "int"
    _, out, _ = dp_ckpt(capsys, "inspect", store / "model.ckpt-9.h5")
    assert "/weights" in out and "record      ok (size)" in out


def test_inspect_without_a_record_goes_by_the_suffix(store, tmp_path, capsys):
    plain = tmp_path / "model.ckpt-3.h5"
    plain.write_bytes((store / "model.ckpt-9.h5").read_bytes())
    status, data = as_json(capsys, "inspect", plain)
    assert status == 0 and data["record"] == "none" and data["step"] == 3
    assert data["format"] == "hdf5" and data["loaded"]


def test_inspect_reports_a_file_that_does_not_load(store, capsys):
    flip_a_byte(store / "model.ckpt-9.h5")
    status, data = as_json(capsys, "inspect", store / "model.ckpt-9.h5", "--digest")
    assert status == 1 and data["record"] == "mismatch"
    with open(store / "model.ckpt-8.h5", "r+b") as handle:
        handle.truncate(10)
    status, data = as_json(capsys, "inspect", store / "model.ckpt-8.h5")
    assert status == 1 and not data["loaded"] and data["load_error"]


def test_inspect_a_torch_checkpoint_with_nested_values(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    with open_manager(tmp_path / "t", "torch") as m:
        path = m.save(4, {"model": make_payload(4, "torch"), "opt": [1, {"lr": 0.5}]})
    status, data = as_json(capsys, "inspect", path)
    assert status == 0 and data["format"] == "torch"
    by = {e["key"]: e for e in data["entries"]}
    weights = make_payload(4, "torch")["weights"]
    assert by["/model/weights"]["type"] == "torch.Tensor"
    assert by["/model/weights"]["shape"] == list(weights.shape)
    assert by["/model/weights"]["dtype"] == str(weights.dtype).removeprefix("torch.")
    assert by["/model/weights"]["bytes"] == weights.numel() * weights.element_size()
    assert by["/opt"]["type"] == "list" and by["/opt/1/lr"]["type"] == "float"
    assert isinstance(torch.zeros(1), torch.Tensor)


def test_inspect_counts_a_shared_storage_once(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    weights = torch.arange(1000, dtype=torch.float64)
    payload = {"model": {"w": weights, "tied": weights, "view": weights[:10]}}
    with open_manager(tmp_path / "t", "torch") as m:
        path = m.save(1, payload)
    status, data = as_json(capsys, "inspect", path)
    assert status == 0
    assert data["payload_bytes"] == 8000  # not 8000 + 8000 + 80
    by = {e["key"]: e for e in data["entries"]}
    assert (by["/model/w"]["bytes"], by["/model/w"]["shares"]) == (8000, None)
    assert by["/model/tied"]["shares"] == "/model/w"
    assert (by["/model/view"]["bytes"], by["/model/view"]["shares"]) == (80, "/model/w")
    _, out, _ = dp_ckpt(capsys, "inspect", path)
    assert "80 (storage of /model/w)" in out and "8.0 kB in arrays/values" in out


def test_inspect_lists_down_to_a_depth_and_says_what_was_cut(tmp_path, capsys):
    nested = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}
    with open_manager(tmp_path / "t", "hdf5") as m:
        path = m.save(1, {**nested, "x": np.ones(3)})
    _, data = as_json(capsys, "inspect", path)
    assert (data["depth"], data["levels_cut"]) == (6, 2)
    assert max(e["key"].count("/") for e in data["entries"]) == 6
    assert data["payload_bytes"] == 24  # every leaf counts, listed or not
    _, data = as_json(capsys, "inspect", path, "--depth", "1")
    assert [e["key"] for e in data["entries"]] == ["/", "/a", "/x"]
    assert data["levels_cut"] == 7
    _, out, _ = dp_ckpt(capsys, "inspect", path, "--depth", "1")
    assert "1 level(s); 7 deeper level(s) not listed (--depth N to see them)" in out
    _, data = as_json(capsys, "inspect", path, "--depth", "20")
    assert data["levels_cut"] == 0
    status, _, err = dp_ckpt(capsys, "inspect", path, "--depth", "0")
    assert status == 2 and "expected a depth of 1 or more" in err


def test_inspect_imports_torch_only_for_a_torch_file(store):
    code = (
        "import sys\n"
        "from dp_ckpt_plugin.commands import main\n"
        f"main(['inspect', {str(store / 'model.ckpt-9.h5')!r}, '--json'])\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr


# -- adopt -----------------------------------------------------------------------------


def plain_store(store, tmp_path):
    """A directory as plain deepmd-kit leaves it: numbered files, no records."""
    d = tmp_path / "plain"
    d.mkdir()
    for step in (8, 9):
        (d / f"model.ckpt-{step}.h5").write_bytes(
            (store / f"model.ckpt-{step}.h5").read_bytes()
        )
    (d / "model.ckpt-10.h5").write_bytes(b"not hdf5")
    return d


def test_adopt_gives_records_to_files_that_load(store, tmp_path, capsys):
    d = plain_store(store, tmp_path)
    status, data = as_json(capsys, "adopt", d, "--dry-run")
    assert status == 1  # one file does not load
    assert [a["name"] for a in data["adopted"]] == [
        "model.ckpt-8.h5",
        "model.ckpt-9.h5",
    ]
    assert [r["name"] for r in data["refused"]] == ["model.ckpt-10.h5"]
    assert not any(record_path(p).exists() for p in d.iterdir())  # dry run
    status, out, _ = dp_ckpt(capsys, "adopt", d)
    assert status == 1 and "2 file(s) adopted" in out
    assert "refused  model.ckpt-10.h5: does not load as hdf5" in out
    assert record_path(d / "model.ckpt-9.h5").exists()
    assert not record_path(d / "model.ckpt-10.h5").exists()
    _, data = as_json(capsys, "resolve", "latest", "--dir", d)
    assert data["name"] == "model.ckpt-9.h5" and data["committed"]
    assert as_json(capsys, "verify", d, "--digest")[0] == 0  # adopted files are sound
    (d / "model.ckpt-10.h5").unlink()
    status, data = as_json(capsys, "adopt", d)
    assert status == 0 and data["adopted"] == [] and data["refused"] == []


def test_adopt_never_overwrites_a_malformed_record(store, tmp_path, capsys):
    d = plain_store(store, tmp_path)
    (d / "model.ckpt-10.h5").unlink()
    bad = record_path(d / "model.ckpt-8.h5")
    bad.write_text("{not json")
    status, data = as_json(capsys, "adopt", d)
    assert status == 0
    assert [a["name"] for a in data["adopted"]] == ["model.ckpt-9.h5"]
    assert [m["name"] for m in data["malformed_records"]] == ["model.ckpt-8.h5"]
    assert bad.read_text() == "{not json"


def test_adopt_is_refused_while_a_run_holds_the_store(store, tmp_path, capsys):
    d = plain_store(store, tmp_path)
    with StoreLock(d):
        status, _, err = dp_ckpt(capsys, "adopt", d)
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert not record_path(d / "model.ckpt-9.h5").exists()


# -- mistakes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ((), 2, "the following arguments are required: COMMAND"),
        (("frobnicate",), 2, "invalid choice: 'frobnicate'"),
        (("ls",), 2, "the following arguments are required: directory"),
        (("ls", "{missing}"), 2, "no such directory"),
        (("ls", "{file}"), 2, "is not a directory"),
        (
            ("ls", "{store}", "--family", "nope"),
            2,
            "has no family 'nope' (families: model.ckpt)",
        ),
        (("verify", "{missing}"), 2, "no such file or directory"),
        (("prune", "{store}", "--keep-last", "many"), 2, "expected an integer"),
        (
            (
                "prune",
                "{store}",
                "--keep-best",
                "2",
                "--best-metric",
                "x",
                "--best-mode",
                "up",
            ),
            2,
            "invalid choice",
        ),
        (
            (
                "prune",
                "{store}",
                "--keep-last",
                "none",
                "--keep-best",
                "0",
                "--keep-every-n-steps",
                "0",
            ),
            2,
            "would keep nothing",
        ),
        (("show", "{store}", "best:{missing}"), 1, "no family kept by a metric"),
        (("resolve",), 2, "the following arguments are required: spec"),
        (("resolve", "latest", "--dir", "{missing}"), 2, "no such directory"),
        (("resolve", "best:{missing}", "--dir", "{store}"), 1, "no family kept"),
        (("inspect", "{missing}"), 2, "no such file"),
        (("inspect", "{store}"), 2, "is not a file"),
        (("inspect", "{notes}"), 2, "no suffix of a known format"),
        (("adopt", "{missing}"), 2, "no such directory"),
    ],
)
def test_mistakes_are_one_line_never_a_traceback(store, capsys, args, status, message):
    names = {
        "store": store,
        "missing": store / "missing",
        "file": store / "model.ckpt-9.h5",
        "notes": store / "notes.txt",
    }
    (store / "notes.txt").write_text("x")
    got, out, err = dp_ckpt(capsys, *(a.format(**names) for a in args))
    assert got == status
    assert err.startswith("dp-ckpt: error: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in out + err


def test_one_line_joins_a_list_of_places():
    text = "no checkpoint found; looked at:\n  - pointer a\n  - alias b\nskipped c"
    assert (
        one_line(text)
        == "no checkpoint found; looked at: pointer a; alias b; skipped c"
    )


def test_the_module_runs_as_a_program(store, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = [sys.executable, "-m", "dp_ckpt_plugin"]
    done = subprocess.run([*run, "--version"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.startswith("dp-ckpt ")
    done = subprocess.run(
        [*run, "ls", str(store)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and "model.ckpt-9.h5" in done.stdout
    done = subprocess.run(
        [*run, "verify", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_importing_the_commands_imports_nothing_heavy():
    code = (
        "import sys, dp_ckpt_plugin.commands, dp_ckpt_plugin.commands.ls\n"
        "import dp_ckpt_plugin.commands.inspect, dp_ckpt_plugin.commands.adopt\n"
        "import dp_ckpt_plugin.commands.resolve, dp_ckpt_plugin.commands.diff\n"
        "import dp_ckpt_plugin.commands.check, dp_ckpt_plugin.commands.show\n"
        "print([m for m in ('torch', 'deepmd', 'h5py', 'rich') if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# -- the documented JSON ------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[1] / "docs" / "command.md"
#: Keys whose values are open mappings (metric names, policy keys).
OPEN = {"metrics", "policy", "input"}


def documented_json(command):
    """The JSON example of ``dp-ckpt <command>`` in docs/command.md."""
    text = DOCS.read_text("utf-8")
    section = text.split(f"## `dp-ckpt {command}`", 1)[1].split("\n## ", 1)[0]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.DOTALL)[1])


def shape_differences(documented, real, where="$"):
    """Where the keys of two JSON values differ (lists: their first items)."""
    if isinstance(documented, dict) and isinstance(real, dict):
        found = []
        if set(documented) != set(real):
            found.append(f"{where}: {sorted(documented)} != {sorted(real)}")
        for key in set(documented) & set(real) - OPEN:
            found += shape_differences(documented[key], real[key], f"{where}.{key}")
        return found
    if isinstance(documented, list) and isinstance(real, list) and documented and real:
        return shape_differences(documented[0], real[0], f"{where}[0]")
    return []


def test_the_json_of_every_command_is_the_documented_one(tmp_path, capsys):
    d = tmp_path / "models"
    policy = {"keep_last": 3, "keep_best": 1, "best_metric": "loss"}
    config = {"model": {"rcut": 6.0}, "training": {"save_dir": str(d)}}
    paths = fill(d, policy, {1: 0.5, 2: 0.4, 3: 0.3}, training_input=config)
    (tmp_path / "input.json").write_text(json.dumps(config), "utf-8")
    (d / "model.ckpt-9.h5").write_bytes(b"no record")
    assert quarantine(paths[1], d, storage=local_storage(d)) is not None
    archived = d / "archive" / "20260101T000000Z"
    archived.mkdir(parents=True)
    (archived / "model.ckpt-7.h5").write_bytes(b"x")
    runs = {
        "ls": ["ls", d],
        "show": ["show", d, "best"],
        "verify": ["verify", d, "--digest"],
        "resolve": ["resolve", "best", "--dir", d],
        "inspect": ["inspect", paths[3]],
        "adopt": ["adopt", d, "--dry-run"],
        "diff": ["diff", paths[2], paths[3]],
        "check": ["check", tmp_path / "input.json", "--restart", "latest"],
        "prune": ["prune", d, "--keep-last", "1", "--keep-best", "0"],
    }
    for command, args in runs.items():
        _, real = as_json(capsys, *args)
        assert shape_differences(documented_json(command), real) == [], command


@pytest.mark.parametrize(
    "args, message",
    [
        (["diff", "nope.pt", "nope.json"], "nope.pt: no such file or directory"),
        (["check", "{input}", "--restart", "latest"], "is not a JSON training input"),
        (["check", "missing.json", "--finetune", "x"], "missing.json: no such file"),
        (["diff", "s3://bucket/run", "{input}"], "diff compares local files"),
    ],
    ids=["diff-missing", "check-not-json", "check-missing", "diff-remote"],
)
def test_diff_and_check_refuse_bad_input_in_one_line(
    tmp_path, capsys, monkeypatch, args, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.json").write_text("{not json", "utf-8")
    args = [a.format(input=tmp_path / "input.json") for a in args]
    status, out, err = dp_ckpt(capsys, *args)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


def test_check_says_what_it_cannot_tell(tmp_path, capsys):
    """A checkpoint that keeps no input: exit 3, and why."""
    d = tmp_path / "models"
    fill(d)
    (tmp_path / "input.json").write_text(
        json.dumps({"training": {"save_dir": str(d)}}), "utf-8"
    )
    status, data = as_json(
        capsys, "check", tmp_path / "input.json", "--restart", "latest"
    )
    assert status == 3 and data["will_load"] is None
    assert "keeps no training input" in data["basis"]
    assert data["checkpoint"]["step"] == max(LOSSES)


def test_prune_refuses_the_option_name_of_0_2_in_one_line(tmp_path, capsys):
    d = tmp_path / "models"
    fill(d, {"keep_last": 0})
    status, _, err = dp_ckpt(capsys, "prune", d, "--dry-run", "--max-ckpt-keep", "1")
    assert status == 2
    assert err.count("\n") == 1 and "--max-ckpt-keep is --keep-last since 0.3" in err
    status, data = as_json(capsys, "prune", d, "--dry-run", "--keep-last", "1")
    assert status == 0
    assert data["families"][0]["policy"] == {"keep_last": 1}


# -- a live store moving on under a reader ----------------------------------------


class _PrunedAfterListing(type(local_storage(None))):
    """A storage whose listing is followed by a retention removing ``doomed``."""

    def __init__(self, doomed):
        super().__init__()
        self.doomed = doomed

    def names(self, directory):
        listed = super().names(directory)
        for path in self.doomed:
            if path.parent == directory and path.exists():
                os.unlink(path)
                os.unlink(record_path(path))
        return listed


def test_files_pruned_after_the_listing_are_not_strays(store):
    from dp_ckpt_plugin.commands.inventory import read_inventory

    kept = sorted(store.glob("model.ckpt-*.h5"))
    doomed = kept[:2]
    inventory = read_inventory(store, storage=_PrunedAfterListing(doomed))
    assert sorted(inventory.vanished) == doomed
    assert [s.path for s in inventory.strays] == []
    assert {c.path for c in inventory.checkpoints()} == set(kept[2:])


def test_verify_lists_again_when_every_listed_file_went(store, capsys, monkeypatch):
    """All that one listing saw was pruned before its records were read."""
    from dp_ckpt_plugin.commands import inventory as inventories

    real = inventories.read_inventory
    calls = []

    def read_inventory(directory, *, storage=None):
        calls.append(directory)
        if len(calls) == 1:  # every listed file goes, as a saving run prunes
            doomed = sorted(Path(directory).glob("model.ckpt-*.h5"))
            found = real(directory, storage=_PrunedAfterListing(doomed))
            assert found.vanished and not found.checkpoints()
            fill(Path(directory), losses={10: 0.5, 11: 0.4})
            return found
        return real(directory)

    monkeypatch.setattr(
        "dp_ckpt_plugin.commands.directory_view.read_inventory", read_inventory
    )
    status, verdict = as_json(capsys, "verify", store)
    assert status == 0 and verdict["ok"], verdict
    assert len(calls) == 2
    assert {Path(c["path"]).name for c in verdict["checkpoints"]} >= {
        "model.ckpt-10.h5",
        "model.ckpt-11.h5",
    }
