"""Rules 1 and 5: names of numbered files, aliases, temporaries and records."""

from __future__ import annotations

import fnmatch

import pytest
from helpers import is_temp

from dp_ckpt_plugin.checkpoint.layout import Family, record_name
from dp_ckpt_plugin.deepmd.naming import ema_family, ema_prefix
from dp_ckpt_plugin.storage.temp import temp_name, temp_target


def test_numbered_name_and_alias():
    fam = Family("model.ckpt", ".pt")
    assert fam.numbered(20) == "model.ckpt-20.pt"
    assert fam.alias == "model.ckpt.pt"
    assert fam.step_of("model.ckpt-20.pt") == 20
    assert fam.step_of("model.ckpt-0.pt") == 0


@pytest.mark.parametrize(
    "name",
    [
        "model.ckpt-007.pt",  # zero-padded: never written by us
        "model.ckpt--5.pt",  # negative
        "model.ckpt-.pt",
        "model.ckpt-1e3.pt",
        "model.ckpt-12.h5",  # another suffix
        "model_ema.ckpt-12.pt",  # another family
        "model.ckpt.pt",  # the alias
        "model.ckpt-best.pt",
    ],
)
def test_names_that_are_not_numbered_checkpoints(name):
    assert Family("model.ckpt", ".pt").step_of(name) is None


def test_huge_step_is_parsed_exactly():
    fam = Family("model.ckpt", ".pt")
    assert (
        fam.step_of("model.ckpt-123456789012345678901234567890.pt")
        == 123456789012345678901234567890
    )


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("model.ckpt", "model_ema.ckpt"), ("run", "run_ema"), ("a.b.c", "a.b_ema.c")],
)
def test_ema_prefix_matches_deepmd(prefix, expected):
    assert ema_prefix(prefix) == expected
    assert ema_family(Family(prefix, ".pt")).prefix == expected


def test_ema_prefix_is_deepmd_kits():
    ema = pytest.importorskip("deepmd.pt_expt.train.ema")
    for prefix in ["model.ckpt", "run", "a.b.c", "x.y"]:
        assert ema_prefix(prefix) == ema.get_ema_checkpoint_prefix(prefix)


def test_family_rejects_paths():
    with pytest.raises(ValueError):
        Family("dir/model.ckpt", ".pt")
    with pytest.raises(ValueError):
        Family("model.ckpt", "pt")


def test_temporary_and_record_names_escape_every_glob():
    fam = Family("model.ckpt", ".pt")
    final = fam.numbered(20)
    names = [
        temp_name(final),
        temp_name(fam.alias),
        record_name(final),
        temp_name(record_name(final)),
    ]
    globs = [
        f"{fam.prefix}-*{fam.suffix}",
        f"{fam.prefix}*",
        f"{fam.prefix}.*",
        "*.pt",
        f"{fam.prefix}-20.*",  # deepmd-kit's symlink_prefix_files glob
        "*",  # shell and glob.glob skip dot files
    ]
    for name in names:
        assert name.startswith(".")
        for pattern in globs[:-1]:
            assert not fnmatch.fnmatch(name, pattern), (name, pattern)
    assert is_temp(names[0]) and temp_target(names[0]) == final
    assert not is_temp(record_name(final))
    assert temp_name(final) != temp_name(final)
