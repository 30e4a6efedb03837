"""One table of limits (rule 44): every bounded field, at its bound and one past it.

For each field of commit records, the store's manifest, HEAD and LEASE, the
largest value the writer accepts is written through the writer, read back
by the reader and found equal; one past it is refused by the writer, with
nothing written. The cases are generated from the table
(:mod:`dp_ckpt_plugin.checkpoint.limits`), and a test checks that every
bound of the table has a case.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from doubles.memory import MemoryStorage, forget

from dp_ckpt_plugin import CheckpointStore
from dp_ckpt_plugin.checkpoint import limits
from dp_ckpt_plugin.checkpoint.layout import Family
from dp_ckpt_plugin.checkpoint.lineage import Lineage, Link
from dp_ckpt_plugin.checkpoint.manifest import (
    FamilyInfo,
    Manifest,
    read_manifest,
    write_manifest,
)
from dp_ckpt_plugin.checkpoint.provenance import (
    DataIdentity,
    DataSystem,
    Provenance,
    canonical,
    read_input,
    write_input,
)
from dp_ckpt_plugin.checkpoint.records import (
    CommitRecord,
    parse_record,
    read_record,
)
from dp_ckpt_plugin.errors import CheckpointWriteError
from dp_ckpt_plugin.remote import catalogue
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import segment_key
from dp_ckpt_plugin.remote.lease import Holder, Lease
from dp_ckpt_plugin.storage import default_storage

DIGEST = "blake3:" + "ab" * 32
DIGEST_SHA = "sha256:" + "cd" * 32
MAX_TIME = limits.MAX_TIME
PAST_TIME = MAX_TIME + 1.0


# -- commit records: the serializer every record goes through ---------------------------
def _record(**over) -> CommitRecord:
    fields = dict(
        name="m-5.pt",
        step=5,
        family="m",
        format="torch",
        size=10,
        digest=DIGEST,
        created=1.0,
    )
    fields.update(over)
    if "step" in over or "family" in over:
        fields.setdefault("name", f"{fields['family']}-{fields['step']}.pt")
        fields["name"] = f"{fields['family']}-{fields['step']}.pt"
    return CommitRecord(**fields)


def _record_round_trip(build: Callable[[object], CommitRecord], read):
    def write(tmp_path: Path, value) -> Callable[[], object]:
        record = build(value)
        text = record.to_json()  # the writer: refuses before any write
        back = parse_record(text, source="r", name=record.name)
        return lambda: read(back)

    return write


def _metrics(n: int, width: int = 8) -> dict[str, float]:
    return {f"{i:0{width}d}": float(i) for i in range(n)}


RECORD_CASES = {
    "record.step": (
        _record_round_trip(lambda v: _record(step=v), lambda r: r.step),
        limits.MAX_STEP,
        limits.MAX_STEP + 1,
    ),
    "record.size": (
        _record_round_trip(lambda v: _record(size=v), lambda r: r.size),
        limits.MAX_INT,
        limits.MAX_INT + 1,
    ),
    "record.replaces.size": (
        _record_round_trip(
            lambda v: _record(replaces=(v, DIGEST)), lambda r: r.replaces[0]
        ),
        limits.MAX_INT,
        limits.MAX_INT + 1,
    ),
    "record.created": (
        _record_round_trip(lambda v: _record(created=v), lambda r: r.created),
        MAX_TIME,
        PAST_TIME,
    ),
    "record.family": (
        _record_round_trip(
            lambda v: _record(family="f" * v, step=5), lambda r: len(r.family)
        ),
        limits.MAX_TEXT - len("-5.pt"),  # the name holds the family
        limits.MAX_TEXT - len("-5.pt") + 1,
    ),
    "record.format": (
        _record_round_trip(lambda v: _record(format="t" * v), lambda r: len(r.format)),
        limits.MAX_TEXT,
        limits.MAX_TEXT + 1,
    ),
    "record.metrics.count": (
        _record_round_trip(
            lambda v: _record(metrics=_metrics(v)), lambda r: len(r.metrics)
        ),
        limits.MAX_METRICS,
        limits.MAX_METRICS + 1,
    ),
    "record.lineage": (
        _record_round_trip(
            lambda v: _record(lineage=_lineage(v)), lambda r: len(r.lineage.chain)
        ),
        limits.MAX_LINEAGE,
        limits.MAX_LINEAGE + 1,
    ),
    "record.metrics.name": (
        _record_round_trip(
            lambda v: _record(metrics={"n" * v: 1.0}),
            lambda r: len(next(iter(r.metrics))),
        ),
        limits.MAX_TEXT,
        limits.MAX_TEXT + 1,
    ),
}


def _lineage(n: int) -> Lineage:
    return Lineage(2, tuple(Link(1, i, DIGEST) for i in range(n)))


def _origin(**over) -> Provenance:
    return dataclasses.replace(Provenance(plugin="0.3.0", python="3.11.7"), **over)


def _systems(n: int, path: str = "data/s") -> DataIdentity:
    systems = tuple(DataSystem("training", f"{path}", DIGEST_SHA) for _ in range(n))
    return DataIdentity(n, DIGEST_SHA, systems)


RECORD_CASES.update(
    {
        "record.provenance.version": (
            _record_round_trip(
                lambda v: _record(provenance=_origin(deepmd_kit="3" * v)),
                lambda r: len(r.provenance.deepmd_kit),
            ),
            limits.MAX_VERSION_TEXT,
            limits.MAX_VERSION_TEXT + 1,
        ),
        "record.provenance.world_size": (
            _record_round_trip(
                lambda v: _record(provenance=_origin(world_size=v)),
                lambda r: r.provenance.world_size,
            ),
            limits.MAX_WORLD_SIZE,
            limits.MAX_WORLD_SIZE + 1,
        ),
        "record.provenance.systems": (
            _record_round_trip(
                lambda v: _record(provenance=_origin(data=_systems(v))),
                lambda r: len(r.provenance.data.systems),
            ),
            limits.MAX_SYSTEMS,
            limits.MAX_SYSTEMS + 1,
        ),
        "record.provenance.data_path": (
            _record_round_trip(
                lambda v: _record(provenance=_origin(data=_systems(1, "p" * v))),
                lambda r: len(r.provenance.data.systems[0].path),
            ),
            limits.MAX_DATA_PATH,
            limits.MAX_DATA_PATH + 1,
        ),
    }
)


def _input_round_trip(tmp_path: Path, size: int) -> Callable[[], object]:
    """A kept input of ``size`` bytes (its canonical JSON), read back."""
    overhead = len(b'{"k":""}')
    config = {"k": "x" * (size - overhead)}
    storage = default_storage()
    digest = write_input(tmp_path, config, storage=storage, durable=False)
    return lambda: len(canonical(read_input(tmp_path, digest, storage=storage)))


INPUT_CASES = {
    "input.bytes": (
        _input_round_trip,
        limits.MAX_INPUT_BYTES,
        limits.MAX_INPUT_BYTES + 1,
    )
}


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [0, high] with ``fits(n)`` (``fits`` is monotone)."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _record_bytes(n: int) -> CommitRecord:
    """A record of ``n`` metrics with names of 200 characters."""
    return _record(metrics=_metrics(n, 200))


def _record_fits(n: int) -> bool:
    try:
        _record_bytes(n).to_json()
    except ValueError:
        return False
    return True


_MOST_WIDE_METRICS = _largest(_record_fits, limits.MAX_METRICS)
RECORD_CASES["record.bytes"] = (
    _record_round_trip(_record_bytes, lambda r: len(r.metrics)),
    _MOST_WIDE_METRICS,
    _MOST_WIDE_METRICS + 1,
)


# -- the save line: refused on every path before a file exists ------------------------
def _save(tmp_path: Path, value) -> Callable[[], object]:
    from dp_ckpt_plugin.plugin import get_plugin_manager

    step, metrics = value
    store = CheckpointStore(tmp_path / "d", format="hdf5", pm=get_plugin_manager())
    try:
        path = store.save(step, {"w": 1}, metrics=metrics)
    finally:
        store.close()
    return lambda: (read_record(path).step, read_record(path).metrics)


def _store_fits(n: int) -> bool:
    from dp_ckpt_plugin.checkpoint.records import check_fits

    try:
        check_fits(
            f"model.ckpt-{limits.MAX_STEP}.h5",
            limits.MAX_STEP,
            "model.ckpt",
            "hdf5",
            _metrics(n, 200),
        )
    except ValueError:
        return False
    return True


_MOST_SAVED = _largest(_store_fits, limits.MAX_METRICS)
SAVE_CASES = {
    "save.step": (
        _save,
        (limits.MAX_STEP, None),
        (limits.MAX_STEP + 1, None),
    ),
    "save.metrics.count": (
        _save,
        (7, _metrics(limits.MAX_METRICS)),
        (7, _metrics(limits.MAX_METRICS + 1)),
    ),
    "save.record.bytes": (
        _save,
        (limits.MAX_STEP, _metrics(_MOST_SAVED, 200)),
        (limits.MAX_STEP, _metrics(_MOST_SAVED + 1, 200)),
    ),
}


# -- the manifest --------------------------------------------------------------------
def _manifest(families: int = 1, prefix: int = 5, fmt: int = 5, policy: int = 0):
    return Manifest(
        "f" * fmt,
        tuple(
            FamilyInfo(
                Family(f"{i:03d}" + "p" * (prefix - 3), ".pt"),
                {"keep_last": 2, "pad": "x" * policy} if policy else None,
                "newest 2",
            )
            for i in range(families)
        ),
    )


def _manifest_round_trip(build, read):
    def write(tmp_path: Path, value) -> Callable[[], object]:
        write_manifest(tmp_path, build(value), durable=False, storage=default_storage())
        return lambda: read(read_manifest(tmp_path))

    return write


def _manifest_fits(n: int) -> bool:
    try:
        _manifest(families=limits.MAX_FAMILIES, policy=n).to_json()
    except ValueError:
        return False
    return True


_MOST_PAD = _largest(_manifest_fits, limits.MAX_MANIFEST_BYTES)
MANIFEST_CASES = {
    "manifest.families": (
        _manifest_round_trip(
            lambda v: _manifest(families=v), lambda m: len(m.families)
        ),
        limits.MAX_FAMILIES,
        limits.MAX_FAMILIES + 1,
    ),
    "manifest.prefix": (
        _manifest_round_trip(
            lambda v: _manifest(prefix=v), lambda m: len(m.families[0].family.prefix)
        ),
        limits.MAX_FILE_NAME,
        limits.MAX_FILE_NAME + 1,
    ),
    "manifest.format": (
        _manifest_round_trip(lambda v: _manifest(fmt=v), lambda m: len(m.format)),
        limits.MAX_FORMAT_NAME,
        limits.MAX_FORMAT_NAME + 1,
    ),
    "manifest.bytes": (
        _manifest_round_trip(
            lambda v: _manifest(families=limits.MAX_FAMILIES, policy=v),
            lambda m: len(m.families[-1].policy["pad"]),
        ),
        _MOST_PAD,
        _MOST_PAD + 1,
    ),
}


# -- HEAD: through update(), the one writer --------------------------------------------
def _entry(step: int = 5, size: int = 10, metrics=None, name_len: int = 0):
    tail = f"-{step}.pt"  # a numbered checkpoint name, as the key grammar needs
    name = f"m{tail}" if not name_len else "n" * (name_len - len(tail)) + tail
    return heads.Entry(f"e000001/{name}", name, step, size, DIGEST, metrics)


def _head_round_trip(before, epoch=1, change=lambda h, v: h, read=lambda h, v: h):
    def write(tmp_path: Path, value) -> Callable[[], object]:
        storage = tmp_path.storage
        start = before(value) if before else None
        heads.update(
            storage,
            epoch(value) if callable(epoch) else epoch,
            lambda h: change(h, value),
            known=(start, None),
        )
        return lambda: read(heads.read(storage)[0], value)

    return write


def _with(entry_of):
    return lambda h, v: h.with_entry("m", entry_of(v), publish=None)


def _with_segments(head, segments):
    """``head`` with one entry of family ``m``, whose segments are ``segments``."""
    one = _with(lambda v: _entry())(head, None)
    family = dataclasses.replace(one.family("m"), segments=tuple(segments))
    return dataclasses.replace(one, families={"m": family})


def _head_fits(n: int) -> bool:
    try:
        _many(n).to_bytes()
    except ValueError:
        return False
    return True


_WIDE = _metrics(limits.MAX_METRICS, 200)


def _many(n: int) -> heads.Head:
    """A HEAD of ``n`` entries, each with the most metrics of wide names."""
    head = heads.Head(epoch=1)
    kept = tuple(_entry(step=i, metrics=_WIDE) for i in range(n))
    return dataclasses.replace(head, families={"m": heads.FamilyState(kept)})


HEAD_CASES = {
    "head.seq": (
        _head_round_trip(lambda v: heads.Head(seq=v - 1), read=lambda h, v: h.seq),
        limits.MAX_INT,
        limits.MAX_INT + 1,
    ),
    "head.epoch": (
        _head_round_trip(None, epoch=lambda v: v, read=lambda h, v: h.epoch),
        limits.MAX_EPOCH,
        limits.MAX_EPOCH + 1,
    ),
    "head.entry.step": (
        _head_round_trip(
            None,
            change=_with(lambda v: _entry(step=v)),
            read=lambda h, v: h.family("m").kept[0].step,
        ),
        limits.MAX_STEP,
        limits.MAX_STEP + 1,
    ),
    "head.entry.size": (
        _head_round_trip(
            None,
            change=_with(lambda v: _entry(size=v)),
            read=lambda h, v: h.family("m").kept[0].size,
        ),
        limits.MAX_INT,
        limits.MAX_INT + 1,
    ),
    "head.entry.name": (
        _head_round_trip(
            None,
            change=_with(lambda v: _entry(name_len=v)),
            read=lambda h, v: len(h.family("m").kept[0].name),
        ),
        limits.MAX_TEXT - len("e000001/"),  # the key holds the name
        limits.MAX_TEXT - len("e000001/") + 1,
    ),
    "head.entry.metrics": (
        _head_round_trip(
            None,
            change=_with(lambda v: _entry(metrics=_metrics(v))),
            read=lambda h, v: len(h.family("m").kept[0].metrics),
        ),
        limits.MAX_METRICS,
        limits.MAX_METRICS + 1,
    ),
    "head.lineage": (
        _head_round_trip(
            None,
            change=lambda h, v: _with(lambda v: _entry())(h, v).with_lineage(
                "m", _lineage(v).chain
            ),
            read=lambda h, v: len(h.family("m").lineage),
        ),
        limits.MAX_LINEAGE,
        limits.MAX_LINEAGE + 1,
    ),
    "head.segments": (
        _head_round_trip(
            None,
            change=lambda h, v: _with_segments(
                h, (heads.Segment(segment_key(1, i), 1, i, i) for i in range(v))
            ),
            read=lambda h, v: len(h.family("m").segments),
        ),
        limits.MAX_SEGMENTS,
        limits.MAX_SEGMENTS + 1,
    ),
    "head.segment.level": (
        _head_round_trip(
            None,
            change=lambda h, v: _with_segments(
                h, [heads.Segment(segment_key(1, 0), 1, 1, 1, v)]
            ),
            read=lambda h, v: h.family("m").segments[0].level,
        ),
        limits.MAX_SEGMENT_LEVEL,
        limits.MAX_SEGMENT_LEVEL + 1,
    ),
    "head.format": (
        _head_round_trip(
            None,
            change=lambda h, v: dataclasses.replace(h, format="f" * v),
            read=lambda h, v: len(h.format),
        ),
        limits.MAX_TEXT,
        limits.MAX_TEXT + 1,
    ),
}


def _head_bytes_case():
    most = _largest(_head_fits, 1000)
    return (
        _head_round_trip(lambda v: _many(v), read=lambda h, v: len(h.family("m").kept)),
        most,
        most + 1,
    )


# -- LEASE: through acquire(), the one writer -----------------------------------------
def _lease(storage, *, ttl=60.0, wall=1.8e9, holder=None) -> Lease:
    return Lease(
        storage,
        ttl=ttl,
        holder=holder or Holder("host", 4242, "dp train", "then"),
        clock=lambda: 1000.0,
        wall=lambda: wall,
        sleep=lambda s: None,
    )


def _lease_round_trip(make, min_epoch=lambda v: 1, read=lambda s, v: s):
    def write(tmp_path: Path, value) -> Callable[[], object]:
        storage = tmp_path.storage
        _lease_of = make(storage, value)
        _lease_of.acquire(min_epoch=min_epoch(value))
        return lambda: read(_lease_of.read()[0], value)

    return write


LEASE_CASES = {
    "lease.epoch": (
        _lease_round_trip(
            lambda s, v: _lease(s), min_epoch=lambda v: v, read=lambda s, v: s.epoch
        ),
        limits.MAX_EPOCH,
        limits.MAX_EPOCH + 1,
    ),
    "lease.renewed": (
        _lease_round_trip(lambda s, v: _lease(s, wall=v), read=lambda s, v: s.renewed),
        MAX_TIME,
        PAST_TIME,
    ),
    "lease.ttl": (
        _lease_round_trip(lambda s, v: _lease(s, ttl=v), read=lambda s, v: s.ttl),
        limits.MAX_LEASE_SECONDS - 1,
        limits.MAX_LEASE_SECONDS,
    ),
    "lease.pid": (
        _lease_round_trip(
            lambda s, v: _lease(s, holder=Holder("h", v, "c", "s")),
            read=lambda s, v: s.holder.pid,
        ),
        limits.MAX_INT,
        limits.MAX_INT + 1,
    ),
}
for _key, _bound in (
    ("host", limits.MAX_HOLDER_HOST),
    ("command", limits.MAX_HOLDER_COMMAND),
    ("since", limits.MAX_HOLDER_SINCE),
):
    LEASE_CASES[f"lease.holder.{_key}"] = (
        _lease_round_trip(
            lambda s, v, k=_key: _lease(
                s, holder=dataclasses.replace(Holder("h", 1, "c", "s"), **{k: "z" * v})
            ),
            read=lambda s, v, k=_key: len(getattr(s.holder, k)),
        ),
        _bound,
        _bound + 1,
    )


CASES = {
    **RECORD_CASES,
    **SAVE_CASES,
    **MANIFEST_CASES,
    **HEAD_CASES,
    **LEASE_CASES,
    **INPUT_CASES,
}


@pytest.fixture
def place(tmp_path):
    """A directory, and an object storage of its own (``place.storage``)."""
    bucket = f"lim{secrets.token_hex(4)}"

    class Place(type(tmp_path)):
        pass

    where = Place(tmp_path)
    where.storage = MemoryStorage(f"memory://{bucket}/run")
    yield where
    forget(bucket)


def _written(place) -> list:
    files = sorted(p.name for p in Path(place).rglob("*"))
    objects = sorted(o.key for o in place.storage.list(""))
    return files + objects


def _expected(case: str, value):
    if case.startswith("save."):
        step, metrics = value
        return step, metrics
    return value


def _check_case(place, case, write, largest, past):
    read = write(place, largest)
    assert read() == _expected(case, largest)
    for leftover in list(Path(place).iterdir()):
        _remove(leftover)
    for info in list(place.storage.list("")):
        place.storage.delete(info.key)
    with pytest.raises((ValueError, CheckpointWriteError)):
        write(place, past)
    assert _written(place) == [], f"{case}: something was written"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()
    else:
        path.unlink()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_largest_value_round_trips_and_one_past_it_is_refused(place, case):
    write, largest, past = CASES[case]
    _check_case(place, case, write, largest, past)


def test_the_largest_head_round_trips_and_one_entry_more_is_refused(place):
    """HEAD's size: the most entries that fit its bytes, and one more."""
    write, largest, past = _head_bytes_case()
    assert 100 < largest < 1000
    _check_case(place, "head.bytes", write, largest, past)


def _segment_round_trip(n: int):
    def write(tmp_path: Path, value) -> Callable[[], object]:
        entries = [_entry(step=i, metrics=_WIDE) for i in range(value)]
        segment = catalogue.write_segment(tmp_path.storage, 1, 0, "m", entries)
        return lambda: len(catalogue.read_segment(tmp_path.storage, "m", segment))

    return write


def _segment_fits(n: int) -> bool:
    try:
        catalogue.segment_bytes("m", [_entry(step=i, metrics=_WIDE) for i in range(n)])
    except ValueError:
        return False
    return True


def test_the_largest_segment_round_trips_and_one_entry_more_is_refused(place):
    """A catalogue segment's size: the most entries that fit its bytes, and one more."""
    most = _largest(_segment_fits, 1000)
    assert 100 < most < 1000
    _check_case(place, "segment.bytes", _segment_round_trip(most), most, most + 1)


def test_every_bound_of_the_table_has_a_case():
    """A bound added to the table without a case here fails."""
    covered = {
        "MAX_INT": "record.size",
        "MAX_STEP": "record.step",
        "MAX_EPOCH": "lease.epoch",
        "MAX_TIME": "record.created",
        "MAX_TEXT": "record.format",
        "MAX_METRICS": "record.metrics.count",
        "MAX_DIGEST_TEXT": None,  # no digest the writer makes comes near it
        "MAX_FAMILIES": "manifest.families",
        "MAX_LINEAGE": "record.lineage",
        "MAX_SEGMENTS": "head.segments",
        "MAX_SEGMENT_LEVEL": "head.segment.level",
        "MAX_SEGMENT_BYTES": "segment.bytes",
        "MAX_FILE_NAME": "manifest.prefix",
        "MAX_FORMAT_NAME": "manifest.format",
        "MAX_REASON": None,  # cut, never refused (informative text)
        "MAX_HOLDER_HOST": "lease.holder.host",
        "MAX_HOLDER_COMMAND": "lease.holder.command",
        "MAX_HOLDER_SINCE": "lease.holder.since",
        "MAX_LEASE_SECONDS": "lease.ttl",
        "MAX_RECORD_BYTES": "record.bytes",
        "MAX_MANIFEST_BYTES": "manifest.bytes",
        "MAX_POINTER_BYTES": None,  # a pointer is one file name, far below it
        "MAX_HEAD_BYTES": "head.bytes",
        "MAX_LEASE_BYTES": None,  # its bounded fields hold about 1 KiB
        "MAX_VERSION_TEXT": "record.provenance.version",
        "MAX_WORLD_SIZE": "record.provenance.world_size",
        "MAX_SYSTEMS": "record.provenance.systems",
        "MAX_DATA_PATH": "record.provenance.data_path",
        "MAX_INPUT_BYTES": "input.bytes",
    }
    table = {name for name in vars(limits) if name.startswith("MAX_")}
    assert table == set(covered)
    for case in covered.values():
        assert case is None or case in CASES or case in ("head.bytes", "segment.bytes")


def test_a_step_of_0_2_above_the_bound_is_still_read(tmp_path):
    """dp-ckpt-plugin 0.2 bounded no step: its record of step 2**63 is committed."""
    step = 1 << 63
    name = f"model.ckpt-{step}.pt"
    text = json.dumps(
        {
            "name": name,
            "step": step,
            "family": "model.ckpt",
            "format": "torch",
            "size": 3,
            "sha256": "0" * 64,
            "created": 1.0,
            "format_version": 1,
        }
    )
    assert parse_record(text, source="r", name=name).step == step
    with pytest.raises(Exception, match="between 0 and"):
        parse_record(
            text.replace('"format_version": 1', '"format_version": 2').replace(
                '"sha256": "' + "0" * 64 + '"', '"digest": "' + DIGEST + '"'
            ),
            source="r",
            name=name,
        )


def test_a_file_above_the_bound_without_a_record_is_refused_by_adoption(tmp_path):
    """Adoption writes no record a reader would refuse: the file is refused,
    in one line naming the step's bound."""
    from dp_ckpt_plugin.plugin import get_plugin_manager
    from dp_ckpt_plugin.store.adoption import adopt_directory

    pm = get_plugin_manager()
    store = CheckpointStore(tmp_path / "d", format="hdf5", pm=pm)
    try:
        path = store.save(1, {"w": 1})
    finally:
        store.close()
    (path.parent / f".{path.name}.commit.json").unlink()
    far = path.with_name(f"model.ckpt-{limits.MAX_STEP + 1}.h5")
    path.rename(far)
    (adoption,) = adopt_directory(
        tmp_path / "d", [(Family("model.ckpt", ".h5"), "hdf5")], pm
    )
    assert adoption.adopted == []
    ((refused, why),) = adoption.refused
    assert refused == far and "a step must be an int from 0 to" in why
    assert not (far.parent / f".{far.name}.commit.json").exists()
