"""``training._dp_ckpt`` and ``training.save_dir``: schema, defaults, errors.

Also the top-level ``dp_ckpt`` section of 0.2 (refused in one line)
and the places where options would be silently ignored (refused).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest
from dargs.dargs import ArgumentError

from dp_ckpt_plugin.deepmd.argcheck import (
    OLD_SECTION,
    SECTION,
    SECTION_PATH,
    PluginOptions,
    check_save_dir,
    gen_doc,
    plugin_args,
    plugin_options,
    save_dir_args,
)
from dp_ckpt_plugin.errors import ConfigError

DEFAULTS = {
    "verify": "digest",
    "lock": True,
    "fsync": True,
    "quarantine": True,
    "check_free_space": True,
    "compat_links": True,
    "async_save": False,
    "stop_signals": ("SIGTERM", "SIGUSR1", "SIGINT"),
    "exact_resume": True,
    "max_archives": None,
    "retention": {},
    "remote": {},
}
OTHER_VALUES = {
    "verify": "size",
    "lock": False,
    "fsync": False,
    "quarantine": False,
    "check_free_space": False,
    "compat_links": False,
    "async_save": True,
    "stop_signals": ("SIGUSR2",),
    "exact_resume": False,
    "max_archives": 3,
}


def with_section(section, **training) -> dict:
    """A whole input holding ``section`` as ``training._dp_ckpt``."""
    return {"training": {**training, SECTION: section}}


def options_error(section) -> str:
    """Return the message of the ConfigError ``section`` raises."""
    with pytest.raises(ConfigError) as info:
        plugin_options(with_section(section))
    return str(info.value)


# -- import -------------------------------------------------------------------


def test_import_pulls_in_neither_torch_nor_deepmd():
    code = (
        "import sys, dp_ckpt_plugin.deepmd.argcheck; "
        "print(sorted(m for m in ('torch', 'deepmd') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- schema -------------------------------------------------------------------


def test_schema_and_dataclass_agree():
    schema = plugin_args()
    assert schema.name == SECTION == "_dp_ckpt"
    assert schema.optional
    fields = {
        f.name: f.default
        if f.default_factory is dataclasses.MISSING
        else f.default_factory()
        for f in dataclasses.fields(PluginOptions)
    }
    defaults = {a.name: a.default for a in schema.sub_fields.values()}
    defaults["stop_signals"] = tuple(defaults["stop_signals"])
    assert defaults == fields
    assert fields == DEFAULTS


def test_every_option_is_documented():
    for arg in plugin_args().sub_fields.values():
        assert len(arg.doc) > 80, arg.name
    text = gen_doc()
    for name in DEFAULTS:
        assert f"_dp_ckpt/{name}" in text
    assert "save_dir" in text


# -- defaults -----------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [{}, {"training": {}}, with_section({}), with_section({"_comment": "x"})],
)
def test_defaults(config):
    assert plugin_options(config) == PluginOptions(**DEFAULTS)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_each_default(name):
    assert getattr(plugin_options({}), name) == DEFAULTS[name]


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_each_option_can_be_set(name):
    value = OTHER_VALUES[name]
    value = list(value) if isinstance(value, tuple) else value
    options = plugin_options(with_section({name: value}))
    assert getattr(options, name) == OTHER_VALUES[name]
    for other in set(DEFAULTS) - {name}:
        assert getattr(options, other) == DEFAULTS[other]


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        plugin_options({}).lock = False


# -- where the options are -----------------------------------------------------------


def test_the_section_stays_in_the_input():
    """DeePMD-kit drops ``_`` keys itself: the input is left as the user wrote it."""
    config = with_section({"verify": "size"}, save_dir="models")
    assert plugin_options(config).verify == "size"
    assert config == {"training": {"save_dir": "models", SECTION: {"verify": "size"}}}


def test_section_given_is_not_mutated():
    section = {"verify": "size", "_comment": "kept"}
    plugin_options(with_section(section))
    assert section == {"verify": "size", "_comment": "kept"}


def test_old_top_level_section_is_refused_in_one_line_naming_its_place():
    training = {"save_dir": "models"}
    config = {"model": {}, "training": training, OLD_SECTION: {"verify": "size"}}
    with pytest.raises(ConfigError) as caught:
        plugin_options(config)
    assert str(caught.value) == (
        "the top-level `dp_ckpt` section is `training._dp_ckpt` since 0.3"
    )
    assert config[OLD_SECTION] == {"verify": "size"}


def test_verify_sha256_is_refused_in_one_line_naming_digest():
    message = options_error({"verify": "sha256"})
    assert message == f"`{SECTION_PATH}/verify`: 'sha256' is 'digest' since 0.3"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"training": {"dp_ckpt": {}}},
            "`training/dp_ckpt`: DeePMD-kit does not accept",
        ),
        ({"_dp_ckpt": {}, "training": {}}, "go in the training section"),
        ({"training": {"_dp_ckp": {"verify": "size"}}}, "Did you mean: _dp_ckpt?"),
        ({"training": {"_dpckpt": {}}}, "`training/_dpckpt`: unknown section"),
    ],
)
def test_misplaced_or_misspelt_section_is_refused(config, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        plugin_options(config)


def test_comments_in_training_are_left_alone():
    assert plugin_options({"training": {"_comment": "dp_ckpt", "_note": {}}}) == (
        PluginOptions()
    )


# -- bad values -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("verify", 3),
        ("verify", None),
        ("verify", ["size"]),
        ("lock", "yes"),
        ("lock", 1),
        ("fsync", None),
        ("quarantine", "true"),
        ("check_free_space", 0),
        ("compat_links", []),
    ],
)
def test_wrong_type(name, value):
    message = options_error({name: value})
    assert f"`{SECTION_PATH}/{name}`" in message
    assert "wrong value type" in message
    assert repr(value) in message


@pytest.mark.parametrize("value", ["md5", "SHA256", "", "none"])
def test_bad_verify_choice(value):
    message = options_error({"verify": value})
    assert f"`{SECTION_PATH}/verify`" in message
    assert "'size', 'digest'." in message
    assert repr(value) in message


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("verfy", "verify"),
        ("lcok", "lock"),
        ("fsyncc", "fsync"),
        ("quarantaine", "quarantine"),
        ("check_free_spac", "check_free_space"),
        ("compat_link", "compat_links"),
    ],
)
def test_unknown_key_suggests_the_closest(typo, meant):
    message = options_error({typo: True})
    assert message == (
        f"invalid input at `{SECTION_PATH}/{typo}`: undefined key `{typo}` "
        f"is not allowed in strict mode. Did you mean: {meant}?"
    )


def test_unknown_key_without_a_close_match_lists_known_keys():
    message = options_error({"colour": "blue"})
    assert f"`{SECTION_PATH}/colour`" in message
    assert "Known keys: verify, lock, fsync" in message


@pytest.mark.parametrize("section", [None, [], "size", 1, True])
def test_section_of_wrong_type(section):
    message = options_error(section)
    assert f"`{SECTION_PATH}` must be a JSON object" in message


def test_whole_input_of_wrong_type():
    with pytest.raises(ConfigError, match="JSON object"):
        plugin_options([SECTION])


@pytest.mark.parametrize(
    ("given", "names"),
    [
        (["SIGTERM"], ("SIGTERM",)),
        (["term", "usr1", "SIGTERM"], ("SIGTERM", "SIGUSR1")),
        (["SIGINT", "SIGHUP"], ("SIGINT", "SIGHUP")),
        ([], ()),
    ],
)
def test_stop_signals_are_named_canonically(given, names):
    assert plugin_options(with_section({"stop_signals": given})).stop_signals == names


@pytest.mark.parametrize("value", [["SIGKILL"], ["SIGSTOP"], ["NOPE"], [15], "SIGTERM"])
def test_stop_signals_refused(value):
    message = options_error({"stop_signals": value})
    assert f"`{SECTION_PATH}/stop_signals`" in message


def test_errors_are_one_paragraph_without_chained_traceback():
    with pytest.raises(ConfigError) as info:
        plugin_options(with_section({"verify": 3}))
    assert "\n" not in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# -- save_dir: accepted ----------------------------------------------------------


def test_save_dir_null_means_no_directory():
    assert check_save_dir(None) is None


def test_save_dir_existing_directory(tmp_path):
    assert check_save_dir(str(tmp_path)) == tmp_path


def test_save_dir_to_be_created_is_not_created(tmp_path):
    target = tmp_path / "a" / "b" / "models"
    assert check_save_dir(str(target)) == target
    assert list(tmp_path.iterdir()) == []


def test_save_dir_relative_is_returned_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(check_save_dir("models")) == "models"
    assert not (tmp_path / "models").exists()


def test_save_dir_symlink_to_directory(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    assert check_save_dir(str(tmp_path / "link")) == tmp_path / "link"


# -- save_dir: refused -----------------------------------------------------------


@pytest.mark.parametrize("value", [3, 3.5, True, [], ["models"], {"a": 1}, b"models"])
def test_save_dir_wrong_type(value):
    with pytest.raises(ConfigError) as info:
        check_save_dir(value)
    message = str(info.value)
    assert "`training.save_dir`" in message
    assert "must be a directory path (a string) or null" in message
    assert type(value).__name__ in message


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_save_dir_empty(value):
    with pytest.raises(ConfigError, match=r"`training.save_dir` must not be empty"):
        check_save_dir(value)


def test_save_dir_names_the_given_key():
    with pytest.raises(ConfigError, match=r"`my.key`"):
        check_save_dir(3, key="my.key")


def test_save_dir_is_a_file(tmp_path):
    target = tmp_path / "models"
    target.write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        check_save_dir(str(target))
    assert "`training.save_dir`" in str(info.value)
    assert f"{target}, which exists but is not a directory" in str(info.value)


def test_save_dir_is_a_broken_symlink(tmp_path):
    target = tmp_path / "models"
    target.symlink_to(tmp_path / "missing")
    with pytest.raises(ConfigError, match="broken symbolic link"):
        check_save_dir(str(target))
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("below", [("models",), ("runs", "models")])
def test_save_dir_cannot_be_created_below_a_file(tmp_path, below):
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file")
    target = blocker.joinpath(*below)
    with pytest.raises(ConfigError) as info:
        check_save_dir(str(target))
    message = str(info.value)
    assert "`training.save_dir`" in message
    assert f"{target} cannot be created because {blocker} is not a directory" in (
        message
    )


@contextlib.contextmanager
def unwritable(directory):
    """Make ``directory`` unwritable for this process, or skip the test.

    Permission bits do not stop root, so root uses the immutable attribute,
    which only some file systems support.
    """
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(0o700)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root and chattr is not installed")
    done = subprocess.run([chattr, "+i", str(directory)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(
            "running as root, where permission bits do not apply, and this file "
            f"system refuses chattr +i: {done.stderr.decode().strip()}"
        )
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("chattr +i did not make the directory unwritable")
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


def test_save_dir_existing_but_unwritable(tmp_path):
    target = tmp_path / "models"
    target.mkdir()
    with unwritable(target), pytest.raises(ConfigError, match="not writable"):
        check_save_dir(str(target))


def test_save_dir_parent_unwritable(tmp_path):
    parent = tmp_path / "readonly"
    parent.mkdir()
    target = parent / "models"
    with unwritable(parent), pytest.raises(ConfigError) as info:
        check_save_dir(str(target))
    assert f"{target} cannot be created because {parent} is not writable" in str(
        info.value
    )


# -- the dargs schema of save_dir agrees ------------------------------------------


@pytest.mark.parametrize("value", [None, "models", "/abs/models"])
def test_save_dir_schema_accepts(value):
    save_dir_args().check_value(value, strict=True)


@pytest.mark.parametrize("value", [3, [], "", "  "])
def test_save_dir_schema_refuses(value):
    with pytest.raises(ArgumentError):
        save_dir_args().check_value(value, strict=True)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("s3://bucket/run", "s3://bucket/run"),
        ("s3://bucket/run/", "s3://bucket/run"),
        ("gs://bkt/a/b", "gs://bkt/a/b"),
        ("az://container/run", "az://container/run"),
        ("memory://b/run", "memory://b/run"),
    ],
)
def test_save_dir_url_of_object_storage_is_taken(url, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_save_dir(url) == expected
    assert list(tmp_path.iterdir()) == []  # nothing is created before the store opens


def test_save_dir_file_url_is_a_local_directory(tmp_path):
    assert check_save_dir(f"file://{tmp_path}/models") == tmp_path / "models"


@pytest.mark.parametrize("url", ["ftp://host/run", "http://x/y", "s3://", "s3:///run"])
def test_save_dir_url_that_no_storage_takes_is_refused_naming_it(
    url, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        check_save_dir(url)
    assert f"{url!r}" in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_save_dir_with_nul_character():
    with pytest.raises(ConfigError, match="NUL"):
        check_save_dir("models\0x")


def test_save_dir_created_by_another_process_meanwhile_is_fine(tmp_path, monkeypatch):
    """Two ranks validate the same input while the chief creates ``save_dir``."""
    import dp_ckpt_plugin.deepmd.argcheck as argcheck

    target = tmp_path / "models"
    real_stat = argcheck.os.stat
    raced = []

    def stat_then_create(path, *args, **kwargs):
        try:
            return real_stat(path, *args, **kwargs)
        finally:
            if not raced and str(path) == str(target):
                raced.append(True)
                os.mkdir(target)  # the chief wins the race right here

    monkeypatch.setattr(argcheck.os, "stat", stat_then_create)
    assert check_save_dir(str(target)) == target
