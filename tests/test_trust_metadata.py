"""Class 2, untrusted metadata (rule 30): what a directory holds is input, not truth.

Walks every field of a commit record and of the store manifest, and the
contents of the pointer and the alias, against the hostile values of
``trust_cases.HOSTILE`` (wrong types, ``10**400``, a 5000-digit number,
negative numbers, ``NaN``/``Infinity``/``1e309`` literals, ``2**63``, empty
and 100 kB strings, ``null``, lists, nested dicts, 100000 levels of nesting,
lone surrogates and NUL, bytes that are not UTF-8, the key left out), plus
whole files that are no JSON object. Each reader must treat the thing as
"not committed" (skip it; a warning is fine) or fail with one line (a
``CheckpointError`` from the API; exit status 1 or 2 and one line on stderr
from ``dp-ckpt``); never crash, and every ``--json`` output is strict JSON.

Generated cases (19 values; 12 record fields, 11 manifest fields):

- ``test_record_field``: 12 x 19 = 228 (field, value) cases: the newest
  checkpoint's record holds the value. ``dp-ckpt verify FILE --digest
  --json`` must not pass a malformed record; then ``resolve("latest")``,
  ``restore("latest")`` (verify="digest"), ``save`` of the next step (the
  run goes on: every record is read again) and ``restore`` after it. Values
  that leave the record valid (``VALID``) must still restore that
  checkpoint, values that make it malformed must not (``EITHER``: both are
  fine); nothing is deleted.
- ``test_record_whole``: 7 records that are no JSON object; the same, and
  ``inspect`` of the file in both forms.
- ``test_records_cli``: 19 cases, one per value: steps 3..14 of a store
  each carry the value in another record field (steps 1 and 2 are sound):
  ``ls``, ``show``, ``verify --digest``, ``prune`` and ``adopt`` with and
  without ``--json``, ``resolve --json`` (``resolve`` is ``show`` with its
  arguments in another order), and ``inspect``, both forms, of the files
  whose ``created`` and ``metrics.loss`` hold it.
- ``test_manifest_field``: 11 x 19 = 209 cases: ``restore("best")`` (the
  manifest names the metric ``best`` ranks by), ``restore("latest")``,
  ``ls --json``, and the subcommands that consume the field (``CONSUMERS``).
  The store writes its manifest and never reads it; ``best`` and the
  commands do.
- ``test_manifest_whole``: 7 manifests that are no JSON object: the API as
  for records, and every subcommand in both forms.
- ``test_pointer``: 18 hostile pointer contents; ``test_alias``: 9 hostile
  alias targets, the pointer removed so that the alias names the latest
  (``/dev/zero`` is class 3's: reading it may never end): ``ls`` and
  ``show`` in both forms, every subcommand with ``--json``, ``inspect`` of
  the alias, and the API as for records.

497 cases in all.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from helpers import make_payload, plugin_manager
from trust_cases import (
    HOSTILE,
    HOSTILE_DOCUMENTS,
    MANIFEST,
    POINTER,
    alias_name,
    attempt,
    ckpt_name,
    cli,
    cli_problems,
    clone,
    manager,
    plant_json,
    record_of,
    restored_problems,
    step_of,
    template,
)

RECORD_FIELDS = (
    "name",
    "step",
    "family",
    "format",
    "size",
    "digest",
    "created",
    "format_version",
    "replaces",
    "metrics",
    "metrics.loss",
    "replaces.size",
)
MANIFEST_FIELDS = (
    "format_version",
    "format",
    "families",
    "families.0",
    "families.0.prefix",
    "families.0.suffix",
    "families.0.pointer",
    "families.0.policy",
    "families.0.reason",
    "families.0.policy.keep_last",
    "families.0.policy.best_metric",
)

#: (field, value) that leave a record valid: its checkpoint stays committed.
VALID = {
    ("metrics", "null"),
    ("metrics", "absent"),
    ("metrics.loss", "null"),
    ("metrics.loss", "number"),
    ("metrics.loss", "negative"),
    ("metrics.loss", "absent"),
    ("replaces", "null"),
    ("replaces", "absent"),
    ("created", "number"),
    ("created", "absent"),
}
#: (field, value) where either answer is right, as long as nothing crashes.
EITHER = {
    ("created", "negative"),  # before 1970: odd, but a time
    ("metrics.loss", "huge-int"),  # a metric may be huge; as "no value" is fine too
    ("metrics.loss", "absurd-size"),
    ("replaces.size", "number"),  # describes another payload: this one still matches
    # a format no installed plugin reads is not malformed: a refusal to load is fine
    ("format", "string"),
    ("format", "empty-string"),
    ("format", "long-string"),
    ("format", "unicode"),
}
#: The newest step of the template store: the one the cases attack.
NEWEST = 3


def allowed_steps(field, value):
    """The steps ``latest`` may give when the newest record holds ``value`` in ``field``."""
    if (field, value) in VALID:
        return (NEWEST,)
    if (field, value) in EITHER:
        return (1, 2, NEWEST)
    return (1, 2)


def plant_record(directory, step, field, value):
    """Put ``HOSTILE[value]`` at ``field`` of the record of ``step``."""
    record = record_of(directory, step)
    if field.startswith("replaces."):  # a valid 'replaces' first, then the value
        import json

        data = json.loads(record.read_text())
        data["replaces"] = {"size": data["size"], "digest": data["digest"]}
        record.write_text(json.dumps(data))
    plant_json(record, field, HOSTILE[value])


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kept_somewhere(root, digest):
    """Whether a file with content ``digest`` is still under ``root``."""
    for base, _, files in os.walk(root):
        for name in files:
            path = Path(base) / name
            if path.is_file() and not path.is_symlink() and sha(path) == digest:
                return True
    return False


@pytest.fixture(scope="module")
def pm():
    return plugin_manager()


def api_problems(directory, allowed, pm, *, keep=None):
    """The API on ``directory``: resolve and restore ``latest``, then save and restore.

    ``allowed`` are the steps ``latest`` may give. The save continues the run
    (it reads every record again, to know what the run may keep). ``keep``
    is the digest of a file that must stay somewhere in the store: nothing
    is deleted, whatever the metadata says.
    """
    problems = []
    m = manager(directory, pm=pm, verify="digest", max_keep=0)
    try:
        found = attempt(m.resolve, "latest")
        if found.kind == "crash":
            problems.append(f"resolve('latest') {found}")
        elif found.kind == "ok" and step_of(found.value.name) not in allowed:
            problems.append(
                f"resolve('latest') gave {found.value.name}, expected step {allowed}"
            )
        if found.kind != "ok" and allowed == (NEWEST,):
            problems.append(f"resolve('latest') refused a valid store: {found}")
        restored = attempt(m.restore, "latest")
        problems += [
            f"restore('latest') {p}" for p in restored_problems(restored, allowed)
        ]
        if restored.kind != "ok" and allowed == (NEWEST,):
            problems.append(f"restore('latest') refused a valid store: {restored}")
        saved = attempt(m.save, 10, make_payload(10))
        if saved.kind == "crash":
            problems.append(f"save(10) {saved}")
        elif saved.kind == "ok":
            back = attempt(m.restore, "latest")
            problems += [
                f"restore('latest') after save(10) {p}"
                for p in restored_problems(back, (10,))
            ]
            if back.kind != "ok":
                problems.append(f"restore('latest') after save(10): {back}")
    finally:
        closed = attempt(m.close)
        if closed.kind == "crash":
            problems.append(f"close() {closed}")
    if keep is not None and not kept_somewhere(directory, keep):
        problems.append("the checkpoint with the hostile metadata was deleted")
    return problems


def run_all(*argvs):
    """Run each ``dp-ckpt`` command line; return the problems, and the runs."""
    problems, runs = [], []
    for argv in argvs:
        run = cli(*argv)
        runs.append(run)
        problems += [f"{run}: {p}" for p in cli_problems(run)]
    return problems, runs


def every_subcommand(store, *, text=True):
    """Each subcommand on ``store`` with ``--json`` and (``text``) without.

    ``resolve`` is ``show`` with the arguments in another order
    (docs/command.md): it runs with ``--json`` only. Read-only ones first.
    """
    argvs = []
    for args in (
        ("ls", store),
        ("show", store),
        ("resolve", "latest", "--dir", store),
        ("verify", store, "--digest"),
        ("prune", store),
        ("adopt", store),
    ):
        if text and args[0] != "resolve":
            argvs.append(args)
        argvs.append((*args, "--json"))
    return argvs


# -- records ---------------------------------------------------------------------


@pytest.mark.parametrize("value", list(HOSTILE))
@pytest.mark.parametrize("field", RECORD_FIELDS)
def test_record_field(tmp_path, pm, field, value):
    """The newest record with a hostile field: skipped, or a clean refusal."""
    store = clone(tmp_path / "s")
    newest = store / ckpt_name(NEWEST)
    keep = sha(newest)
    plant_record(store, NEWEST, field, value)
    problems, [verify] = run_all(("verify", newest, "--digest", "--json"))
    verdict = verify.json if verify.json is not None else {}
    malformed = (field, value) not in VALID | EITHER
    if malformed and verdict and (verdict.get("ok") or verify.rc != 1):
        problems.append(f"{verify}: a record with {field}={value} passed")
    if (field, value) in VALID and verdict and (not verdict.get("ok") or verify.rc):
        problems.append(f"{verify}: a valid record with {field}={value} failed")
    problems += api_problems(store, allowed_steps(field, value), pm, keep=keep)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("document", list(HOSTILE_DOCUMENTS))
def test_record_whole(tmp_path, pm, document):
    """The newest record is no JSON object at all."""
    store = clone(tmp_path / "s")
    newest = store / ckpt_name(NEWEST)
    keep = sha(newest)
    record_of(store, NEWEST).write_bytes(HOSTILE_DOCUMENTS[document])
    problems, runs = run_all(
        ("verify", newest, "--json"),
        ("inspect", newest, "--json"),
        ("inspect", newest),
    )
    if runs[0].json is not None and runs[0].json.get("ok"):
        problems.append(f"{runs[0]}: a record that is no JSON object passed")
    problems += api_problems(store, (1, 2), pm, keep=keep)
    assert not problems, "\n".join(problems)


#: The record fields ``inspect`` renders (its --json and its table), one file each.
INSPECTED = ("created", "metrics.loss")


@pytest.mark.parametrize("value", list(HOSTILE))
def test_records_cli(tmp_path, value):
    """Every subcommand on a store whose records carry ``value``, each in another field."""
    steps = tuple(range(1, NEWEST + len(RECORD_FIELDS)))
    store = clone(tmp_path / "s", steps=steps)
    hostile = {}
    for step, field in zip(steps[NEWEST - 1 :], RECORD_FIELDS, strict=True):
        plant_record(store, step, field, value)
        hostile[step] = field
    argvs = every_subcommand(store)
    for step, field in hostile.items():
        if field in INSPECTED:  # before prune and adopt change the store
            path = store / ckpt_name(step)
            argvs[6:6] = [("inspect", path), ("inspect", path, "--json")]
    problems, runs = run_all(*argvs)
    for run in runs:
        if run.argv[0] == "verify" and run.rc == 0:
            problems.append(
                f"{run}: every record is hostile in one field, yet it passed"
            )
        if run.argv[0] in ("show", "resolve") and run.json and run.rc == 0:
            step = run.json.get("step")
            field = hostile.get(step)
            if field and (field, value) not in VALID | EITHER:
                problems.append(
                    f"{run}: chose step {step}, whose record has {field}={value}"
                )
    assert not problems, "\n".join(problems)


# -- the manifest ----------------------------------------------------------------

#: Which subcommands consume a manifest field beyond reading it (docs/command.md):
#: ``ls`` prints its format, families and policies, ``show`` and ``verify`` walk
#: its families, ``prune`` applies its policy, ``adopt`` loads files with its
#: format, ``best`` ranks by its metric. ``ls --json`` and ``restore("best")``
#: run on every case.
LS = ("ls",)
SHOW = [("show", "--json"), ("verify", "--json")]
PRUNE = [("prune", "--dry-run", "--json"), LS]
CONSUMERS = {
    "format": [("adopt", "--dry-run", "--json"), LS],
    "families": SHOW,
    "families.0": [*SHOW, LS],
    "families.0.prefix": [*SHOW, LS],
    "families.0.suffix": [*SHOW, LS],
    "families.0.pointer": SHOW,
    "families.0.policy": PRUNE,
    "families.0.reason": [LS],
    "families.0.policy.keep_last": PRUNE,
    "families.0.policy.best_metric": [*PRUNE, ("show", "best", "--json")],
}


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One store for the manifest cases: they change nothing but its manifest."""
    store = clone(tmp_path_factory.mktemp("manifest") / "s")
    return store, (store / MANIFEST).read_bytes()


def manifest_problems(store, pm, commands):
    """``restore`` of ``best`` and ``latest``, ``ls --json`` and ``commands`` on ``store``."""
    problems = []
    m = manager(store, pm=pm, verify="digest", max_keep=0)
    try:
        for spec in ("best", "latest"):
            got = attempt(m.restore, spec)
            problems += [
                f"restore({spec!r}) {p}" for p in restored_problems(got, (1, 2, 3))
            ]
    finally:
        attempt(m.close)
    argvs = [("ls", store, "--json")]
    argvs += [(name, store, *rest) for name, *rest in commands]
    more, _ = run_all(*argvs)
    return problems + more


@pytest.mark.parametrize("value", list(HOSTILE))
@pytest.mark.parametrize("field", MANIFEST_FIELDS)
def test_manifest_field(shared_store, pm, field, value):
    """The store manifest with a hostile field."""
    store, original = shared_store
    (store / MANIFEST).write_bytes(original)
    plant_json(store / MANIFEST, field, HOSTILE[value])
    problems = manifest_problems(store, pm, CONSUMERS.get(field, []))
    assert sorted(os.listdir(store)) == sorted(os.listdir(template())), (
        "a case changed the store"
    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("document", list(HOSTILE_DOCUMENTS))
def test_manifest_whole(tmp_path, pm, document):
    """The store manifest is no JSON object at all: every subcommand, both forms."""
    store, spare = clone(tmp_path / "s"), clone(tmp_path / "api")
    for directory in (store, spare):
        (directory / MANIFEST).write_bytes(HOSTILE_DOCUMENTS[document])
    problems, _ = run_all(*every_subcommand(store))
    m = manager(spare, pm=pm, max_keep=0)
    try:
        best = attempt(m.restore, "best")
        problems += [f"restore('best') {p}" for p in restored_problems(best, (1, 2, 3))]
    finally:
        attempt(m.close)
    problems += api_problems(spare, (1, 2, 3), pm)
    assert not problems, "\n".join(problems)


# -- pointers and aliases --------------------------------------------------------

HOSTILE_POINTERS = {
    "empty": b"",
    "blank-lines": b"\n\n\n",
    "two-lines": b"model.ckpt-3.h5\nmodel.ckpt-1.h5\n",
    "nul": b"model.ckpt-3.h5\0",
    "not-utf8": b"model.ckpt-\xff.h5\n",
    "itself": b"checkpoint\n",
    "the-record": b".model.ckpt-3.h5.commit.json\n",
    "the-manifest": b".dp_ckpt.store.json\n",
    "the-directory": b".\n",
    "parent": b"..\n",
    "etc-passwd": b"../../../../../../../../etc/passwd\n",
    "name-too-long": b"model.ckpt-" + b"1" * 300 + b".h5\n",
    "path-too-long": b"a/" * 2040 + b"model.ckpt-3.h5\n",
    "huge-step": b"model.ckpt-" + b"9" * 200 + b".h5\n",
    "negative-step": b"model.ckpt--3.h5\n",
    "missing": b"model.ckpt-99.h5\n",
    "over-4-kib": b"model.ckpt-3.h5" + b" " * 5000 + b"\n",
    "json": b'{"latest": "model.ckpt-3.h5"}\n',
}

HOSTILE_ALIASES = {
    "itself": "model.ckpt.h5",
    "loop": "loop-a",  # loop-a -> loop-b -> loop-a
    "the-record": ".model.ckpt-3.h5.commit.json",
    "the-pointer": "checkpoint",
    "the-directory": ".",
    "root": "/",
    "name-too-long": "model.ckpt-" + "1" * 300 + ".h5",
    "not-utf8": b"model.ckpt-\xff.h5",
    "dangling": "model.ckpt-99.h5",
}


def link_problems(store, pm):
    """Every subcommand (``--json``; ``ls`` and ``show`` also without), then the API."""
    argvs = [("ls", store), ("show", store), *every_subcommand(store, text=False)]
    argvs.insert(4, ("inspect", store / alias_name(), "--json"))
    problems, _ = run_all(*argvs)
    return problems + api_problems(store, (1, 2, 3), pm)


@pytest.mark.parametrize("content", list(HOSTILE_POINTERS))
def test_pointer(tmp_path, pm, content):
    """The latest pointer with hostile content: skipped (the alias answers) or refused."""
    store = clone(tmp_path / "s")
    (store / POINTER).write_bytes(HOSTILE_POINTERS[content])
    problems = link_problems(store, pm)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("target", list(HOSTILE_ALIASES))
def test_alias(tmp_path, pm, target):
    """The latest alias leads somewhere hostile; the pointer is gone."""
    store = clone(tmp_path / "s")
    (store / POINTER).unlink()
    alias = store / alias_name()
    alias.unlink()
    os.symlink(HOSTILE_ALIASES[target], os.fsencode(alias))
    if target == "loop":
        os.symlink("loop-b", store / "loop-a")
        os.symlink("loop-a", store / "loop-b")
    problems = link_problems(store, pm)
    assert not problems, "\n".join(problems)
