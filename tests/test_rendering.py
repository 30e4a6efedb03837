"""Text from a store reaches a person only as one printable line.

:func:`dp_ckpt_plugin.text.shown` is checked on its own; then every field of
HEAD and LEASE that holds free text is given every hostile value (terminal
escapes, a carriage return, a newline, a bidirectional override, a line
separator, ``rich`` markup, a huge string), and every ``dp-ckpt`` command
that prints a remote store is run on it: each line of its output and of its
errors is printable, and no command ends in a traceback. The log lines of
the package's logger, and the lines a run says about the lease holder, are
checked the same way.
"""

from __future__ import annotations

import json
import logging
import secrets

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import gone_holder, make_payload, remote_store

from dp_ckpt_plugin.checkpoint.limits import MAX_HOLDER_HOST
from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import StoreLockedError
from dp_ckpt_plugin.remote.keys import HEAD_KEY, LEASE_KEY
from dp_ckpt_plugin.remote.lease import Holder, Lease, LeaseState
from dp_ckpt_plugin.text import MAX_SHOWN, shown

HOSTILE = {
    "escape": "\x1b[2J\x1b[31mred\x1b]0;title\x07",
    "return": "ok\rFAKE LINE",
    "newline": "one\ndp-ckpt: error: forged",
    "bidi": "abc\u202etxt.exe\u2066",
    "separator": "a\u2028b\u2029c\x85d",
    "markup": "[bold red]loud[/bold red]",
    "broken markup": "[/]",
    "controls": "\x00\x07\x08\x0b\x0c\x7f\x9b",
    "long": "x" * 100_000,
}


def printable(text: str) -> bool:
    """Every line of ``text`` holds printable characters only."""
    return all(c == " " or c.isprintable() for line in text.split("\n") for c in line)


@pytest.mark.parametrize("name", HOSTILE)
def test_shown_is_one_printable_bounded_line(name):
    value = HOSTILE[name]
    found = shown(value)
    assert "\n" not in found and printable(found)
    assert len(found) <= MAX_SHOWN
    assert shown(found) == found  # showing twice changes nothing


def test_shown_keeps_printable_text_of_any_script():
    text = "model.ckpt-10.pt Ünïcødé 名前 αβγ ✓ a\\b"
    assert shown(text) == text
    assert shown("a\x1bb\nc") == "a\\x1bb\\nc"
    assert shown("y" * 500, 30) == "y" * 6 + "...(494 more characters)"


# -- every field of HEAD and LEASE, every command -------------------------------


def _head_fields(head):
    """(label, setter) for each free-text field of a HEAD document."""
    (prefix,) = head["families"]

    def family(doc, value):
        doc["families"][value] = doc["families"].pop(prefix)

    def entry(field):
        def put(doc, value):
            fam = doc["families"][prefix]
            for e in fam["kept"]:
                old = e[field]
                e[field] = f"{old}{value}"
                if field == "key" and fam["latest"] == old:
                    fam["latest"] = e[field]

        return put

    def latest(doc, value):
        fam = doc["families"][prefix]
        old = fam["latest"]
        for e in fam["kept"]:
            if e["key"] == old:
                e["key"] = fam["latest"] = f"{old}{value}"

    return {
        "family": family,
        "format": lambda doc, v: doc.__setitem__("format", v),
        "entry name": entry("name"),
        "entry key": entry("key"),
        "published key": latest,
        "pointer": lambda doc, v: doc["families"][prefix].__setitem__("pointer", v),
        "archive": lambda doc, v: doc.__setitem__("archives", [f"archive/{v}.json"]),
    }


LEASE_FIELDS = ("host", "command", "since")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The objects of a remote store holding steps 1-3, lease released."""
    from helpers import plugin_manager

    bucket = f"r{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    with remote_store(
        plugin_manager(),
        tmp_path_factory.mktemp("w"),
        storage,
        keep=0,
        holder=gone_holder(),
    ) as store:
        for step in (1, 2, 3):
            store.save(step, make_payload(step))
            store.remote.flush(30)
    objects = {i.key: storage.get(i.key, 1 << 30)[0] for i in storage.list("")}
    forget(bucket)
    return objects


def _cases():
    fields = [f"HEAD {f}" for f in _head_fields(_sample_head())]
    fields += [f"LEASE {f}" for f in LEASE_FIELDS]
    return [(f, h) for f in fields for h in HOSTILE]


def _sample_head():
    return {
        "families": {
            "model.ckpt": {
                "kept": [{"key": "k", "name": "n", "step": 1}],
                "latest": "k",
            }
        }
    }


@pytest.fixture
def hostile_store(request, written):
    field, hostile = request.param
    bucket = f"h{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    for key, data in written.items():
        storage.put(key, data)
    value = HOSTILE[hostile][:2000]  # within every field's bound
    if field.startswith("HEAD "):
        doc = json.loads(written[HEAD_KEY])
        _head_fields(doc)[field.removeprefix("HEAD ")](doc, value)
        storage.put(HEAD_KEY, json.dumps(doc).encode())
    else:
        doc = json.loads(written[LEASE_KEY])
        doc["holder"][field.removeprefix("LEASE ")] = value
        doc["released"] = False
        storage.put(LEASE_KEY, json.dumps(doc).encode())
    yield storage.url
    forget(bucket)


COMMANDS = (
    ["ls", "{url}"],
    ["ls", "{url}", "--json"],
    ["verify", "{url}", "--size-only"],
    ["verify", "{url}", "--json", "--size-only"],
    ["show", "{url}"],
    ["resolve", "latest", "--dir", "{url}"],
    ["resolve", "latest", "--dir", "{url}", "--path"],
    ["prune", "{url}", "--keep-last", "1", "--dry-run"],
    ["prune", "{url}", "--release-lease"],
)


@pytest.mark.parametrize("hostile_store", _cases(), indirect=True, ids=str)
def test_every_command_prints_every_hostile_field_as_printable_lines(
    hostile_store, capsys
):
    for command in COMMANDS:
        argv = [a.replace("{url}", hostile_store) for a in command]
        status = main(argv)  # a traceback would raise here
        out, err = capsys.readouterr()
        assert status in (0, 1, 2), argv
        assert printable(out), (argv, out[:500])
        assert printable(err), (argv, err[:500])
        assert len(err.splitlines()) <= 3, (argv, err[:500])
        if "--json" in argv and status == 0:
            json.loads(out)


# -- log lines ---------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE)
def test_every_log_line_of_the_package_is_one_printable_line(name, caplog):
    log = logging.getLogger("dp_ckpt_plugin")
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        log.warning("checkpoint %s: %s", HOSTILE[name], {"k": HOSTILE[name]})
    message = caplog.records[-1].getMessage()
    assert "\n" not in message and printable(message)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_holder_is_shown_escaped_when_waited_for_and_refused(name, caplog):
    bucket = f"l{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    value = HOSTILE[name][:MAX_HOLDER_HOST]  # the longest host a LEASE may hold
    try:
        holder = Holder(value, 4242, value, value[:64])
        storage.put(LEASE_KEY, LeaseState(3, holder, 0.0, 60.0).to_bytes())
        now = [0.0]
        lease = Lease(
            storage,
            clock=lambda: now[0],
            wall=lambda: 100.0,
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
        with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
            assert lease.acquire() == 4
        for record in caplog.records:
            assert printable(record.getMessage())
        assert any("took over" in n for n in lease.notes)
        assert all(printable(n) for n in lease.notes)
        # renewed a moment ago by this host's clock: refused at once, escaped
        storage.put(LEASE_KEY, LeaseState(9, holder, 100.0, 60.0).to_bytes())
        with pytest.raises(StoreLockedError) as caught:
            Lease(storage, wall=lambda: 100.0).acquire()
        assert "\n" not in str(caught.value) and printable(str(caught.value))
    finally:
        forget(bucket)


# -- a staging directory: what its records say -----------------------------------------

LOCAL_COMMANDS = (
    ["ls", "{dir}"],
    ["show", "{dir}"],
    ["verify", "{dir}"],
    ["resolve", "latest", "--dir", "{dir}"],
    ["prune", "{dir}", "--keep-last", "1", "--dry-run"],
)


@pytest.mark.parametrize("name", HOSTILE)
def test_every_command_prints_a_hostile_record_field_of_a_directory_as_printable_lines(
    tmp_path, capsys, name
):
    """A metric's name in a commit record of a staging directory ``S``, printed by
    every command that reads ``S``."""
    from helpers import open_manager

    value = HOSTILE[name][:2000]
    directory = tmp_path / "S"
    with open_manager(directory, max_keep=0) as manager:
        for step in (1, 2):
            manager.save(step, make_payload(step), metrics={value: 1.0, "loss": 2.0})
    for command in LOCAL_COMMANDS:
        argv = [a.replace("{dir}", str(directory)) for a in command]
        status = main(argv)
        out, err = capsys.readouterr()
        assert status in (0, 1), (argv, err)
        assert printable(out), (argv, out[:500])
        assert printable(err), (argv, err[:500])


def test_every_module_logs_through_the_guarded_logger():
    """A logger filter sees only its own logger's records: every module of the
    package logs through ``dp_ckpt_plugin`` (the host's log set-up, which
    configures deepmd-kit's loggers and reads the handlers of ``deepmd``,
    aside)."""
    import ast
    from pathlib import Path

    import dp_ckpt_plugin

    root = Path(dp_ckpt_plugin.__file__).parent
    elsewhere = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in ("deepmd/logs.py", "text.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and not (
                    len(node.args) == 1
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in ("dp_ckpt_plugin", "deepmd")
                )
            ):
                elsewhere.append(f"{path.relative_to(root)}:{node.lineno}")
    assert elsewhere == []


def test_the_host_shortens_paths_and_the_guard_still_renders_last(
    caplog, monkeypatch, tmp_path
):
    """The host's filter shortens a path argument; the guard, formatting the
    message, runs after it whatever the order they were added in."""
    from pathlib import Path

    from dp_ckpt_plugin.deepmd.logs import shorten_paths

    monkeypatch.chdir(tmp_path)
    shorten_paths()
    log = logging.getLogger("dp_ckpt_plugin")
    hostile = Path(tmp_path / "models" / "model\x1b[31m.ckpt-5\n.pt")
    with caplog.at_level(logging.INFO, logger="dp_ckpt_plugin"):
        log.info("removed %s (retention)", hostile)
    message = caplog.records[-1].getMessage()
    assert message == "removed models/model\\x1b[31m.ckpt-5\\n.pt (retention)"
