"""The conformance suite of the object protocol: every storage passes it.

Each test runs on :class:`DirectoryStorage` (a directory), :class:`MemoryStorage`
and :class:`CloudStorage` on moto's S3 server (skipped without moto and
obstore). Round trips of every primitive, empty objects and ranges, payloads
large enough for a multipart upload from bytes, a path and an open file, key
checks on every primitive, the two conditions, versions, bounded reads,
listings by prefix, and races of creators and of compare-and-swap writers.
"""

from __future__ import annotations

import io
import os
import secrets
import threading
from pathlib import Path

import pytest
from doubles.directory import DirectoryStorage
from doubles.memory import MemoryStorage, forget

from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.storage.objects import (
    KeyExistsError,
    KeyMissingError,
    ObjectStorage,
    StorageUnavailableError,
    VersionMismatchError,
)

KINDS = ["local", "memory", "s3"]
#: Larger than two parts of a multipart upload (CloudStorage's PART_SIZE).
LARGE = (16 << 20) * 2 + 12345


def make_storage(kind: str, request, tmp_path, name: str = "run"):
    if kind == "local":
        return DirectoryStorage(tmp_path / "objects" / name)
    if kind == "memory":
        bucket = request.node.stash.setdefault(_BUCKET, f"t{secrets.token_hex(6)}")
        request.addfinalizer(lambda: forget(bucket))
        return MemoryStorage(f"memory://{bucket}/{name}")
    from dp_ckpt_plugin.objectstore.cloud import CloudStorage

    bucket = request.getfixturevalue("s3_bucket")
    return CloudStorage(f"s3://{bucket.name}/{name}")


_BUCKET = pytest.StashKey[str]()


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


@pytest.fixture
def storage(kind, request, tmp_path):
    return make_storage(kind, request, tmp_path)


def data_of(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every offset from those of another seed or size."""
    block = bytes((i * 7 + seed) % 251 for i in range(251))
    return (block * (size // 251 + 1))[:size]


# -- round trips -----------------------------------------------------------------


def test_it_is_an_object_storage(storage):
    assert isinstance(storage, ObjectStorage)
    assert storage.capabilities.conditional


def test_put_get_head_round_trip(storage):
    info = storage.put("a/b", b"hello")
    assert (info.key, info.size) == ("a/b", 5)
    data, got = storage.get("a/b")
    assert data == b"hello"
    assert (got.key, got.size, got.version) == ("a/b", 5, info.version)
    head = storage.head("a/b")
    assert (head.size, head.version) == (5, info.version)
    assert head.modified > 0


def test_what_is_absent_is_none_or_missing(storage):
    assert storage.get("nothing/here") is None
    assert storage.head("nothing/here") is None
    with pytest.raises(KeyMissingError):
        storage.get_range("nothing/here", 0, 10)
    with pytest.raises(KeyMissingError):
        storage.get_range("nothing/here", 0, 0)
    with pytest.raises(KeyMissingError):
        storage.download("nothing/here", io.BytesIO())
    assert not storage.delete("nothing/here")


def test_empty_objects(storage):
    info = storage.put("empty", b"")
    assert info.size == 0
    assert storage.get("empty")[0] == b""
    assert storage.head("empty").size == 0
    assert storage.get_range("empty", 0, 0) == b""
    assert storage.get_range("empty", 0, 10) == b""
    sink = io.BytesIO()
    assert storage.download("empty", sink).size == 0
    assert sink.getvalue() == b""
    assert storage.put_if_absent("empty2", b"").size == 0
    assert storage.get("empty2")[0] == b""


RANGES = [(0, 1), (10, 20), (0, 1000), (990, 1000), (990, 2000), (5, 5), (1000, 1000)]
RANGES += [(1000, 1010), (1500, 1600), (0, 0)]


@pytest.mark.parametrize(("start", "end"), RANGES, ids=lambda v: str(v))
def test_ranges_read_like_slices(storage, start, end):
    data = data_of(1000)
    storage.put("r", data)
    assert storage.get_range("r", start, end) == data[start:end]


@pytest.mark.parametrize("source", ["bytes", "memoryview", "file"])
def test_large_payloads_round_trip_byte_exact(storage, kind, source, tmp_path):
    data = data_of(LARGE, seed=3)
    if source == "bytes":
        given = data
    elif source == "memoryview":
        given = memoryview(bytearray(data))
    else:
        path = tmp_path / "payload.bin"
        path.write_bytes(data)
        given = path.open("rb")
    info = storage.put("big/payload", given)
    if source == "file":
        given.close()
    assert info.size == LARGE
    head = storage.head("big/payload")
    assert (head.size, head.version) == (LARGE, info.version)
    if kind == "s3":  # sent in parts: the ETag of a multipart upload ends in -N
        assert info.version.rstrip('"').endswith("-3"), info.version
    sink = io.BytesIO()
    got = storage.download("big/payload", sink)
    assert (got.size, got.version) == (LARGE, info.version)
    assert sink.getvalue() == data
    edge = 16 << 20
    assert (
        storage.get_range("big/payload", edge - 5, edge + 5)
        == data[edge - 5 : edge + 5]
    )


def test_an_open_file_is_read_from_where_it_stands(storage, tmp_path):
    path = tmp_path / "p.bin"
    path.write_bytes(b"header" + b"body")
    with path.open("rb") as handle:
        handle.read(6)
        info = storage.put("k", handle)
    assert info.size == 4
    assert storage.get("k")[0] == b"body"


def test_delete(storage):
    storage.put("gone/soon", b"x")
    assert storage.delete("gone/soon")
    assert storage.get("gone/soon") is None
    assert not storage.delete("gone/soon")
    assert list(storage.list("gone/")) == []


# -- keys ------------------------------------------------------------------------

BAD_KEYS = ["", "/a", "a/", "a//b", ".", "..", "a/../b", "./a", "a/.", "a\0b", None, 5]
PRIMITIVES = {
    "put": lambda s, k: s.put(k, b"x"),
    "put_if_absent": lambda s, k: s.put_if_absent(k, b"x"),
    "put_if_match": lambda s, k: s.put_if_match(k, b"x", "v"),
    "get": lambda s, k: s.get(k),
    "get_range": lambda s, k: s.get_range(k, 0, 1),
    "download": lambda s, k: s.download(k, io.BytesIO()),
    "head": lambda s, k: s.head(k),
    "delete": lambda s, k: s.delete(k),
    "url_of": lambda s, k: s.url_of(k),
}


@pytest.mark.parametrize("op", sorted(PRIMITIVES))
def test_every_primitive_refuses_every_bad_key(storage, op):
    for key in BAD_KEYS:
        with pytest.raises(ValueError, match="not an object key"):
            PRIMITIVES[op](storage, key)
    assert list(storage.list("")) == []


def test_list_refuses_a_prefix_that_climbs(storage):
    for prefix in ("/a", "../a", "a/../b"):
        with pytest.raises(ValueError):
            list(storage.list(prefix))


# -- conditions and versions -----------------------------------------------------


def test_put_if_absent_twice(storage):
    first = storage.put_if_absent("lease", b"one")
    with pytest.raises(KeyExistsError) as raised:
        storage.put_if_absent("lease", b"two")
    assert "lease" in str(raised.value)
    data, info = storage.get("lease")
    assert (data, info.version) == (b"one", first.version)


def test_compare_and_swap(storage):
    first = storage.put("HEAD", b"1")
    second = storage.put_if_match("HEAD", b"2", first.version)
    assert second.version != first.version
    assert storage.get("HEAD") == (b"2", storage.head("HEAD"))
    with pytest.raises(VersionMismatchError):
        storage.put_if_match("HEAD", b"3", first.version)  # stale
    assert storage.get("HEAD")[0] == b"2"
    third = storage.put_if_match("HEAD", b"3", second.version)
    assert storage.head("HEAD").version == third.version


def test_compare_and_swap_on_an_absent_key_is_refused(storage):
    with pytest.raises(VersionMismatchError):
        storage.put_if_match("nothing", b"x", "any-version")
    assert storage.head("nothing") is None
    info = storage.put("was", b"x")
    storage.delete("was")
    with pytest.raises(VersionMismatchError):
        storage.put_if_match("was", b"y", info.version)
    assert storage.head("was") is None


def test_versions_change_on_every_put(storage):
    seen = set()
    puts = [
        lambda i: storage.put("v", data_of(10, i)),
        lambda i: storage.put_if_match("v", data_of(11, i), storage.head("v").version),
    ]
    seen.add(storage.put_if_absent("v", b"start").version)
    for i in range(6):
        info = puts[i % 2](i)
        assert info.version == storage.head("v").version
        seen.add(info.version)
    assert len(seen) == 7


def test_identical_content_gets_a_new_version_except_on_s3(storage, kind):
    """An S3 ETag is the MD5 of a single-part object: the same bytes, the same ETag.

    A compare-and-swap on S3 therefore cannot tell two writes of the same
    bytes apart; what is swapped (a HEAD, a lease) must differ each time.
    """
    versions = {storage.put("same", b"same bytes").version for _ in range(3)}
    assert len(versions) == (1 if kind == "s3" else 3)


def test_get_respects_its_limit(storage):
    storage.put("small", data_of(100))
    assert storage.get("small", limit=100)[0] == data_of(100)
    with pytest.raises(StorageUnavailableError, match="100 bytes, more than 99"):
        storage.get("small", limit=99)


# -- listing ---------------------------------------------------------------------

LISTED = ["run/1", "run/2/x", "run2/1", "ru", "other/run/1", "run/22"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", sorted(LISTED)),
        ("run/", ["run/1", "run/2/x", "run/22"]),
        ("run", ["run/1", "run/2/x", "run/22", "run2/1"]),
        ("ru", ["ru", "run/1", "run/2/x", "run/22", "run2/1"]),
        ("run/2", ["run/2/x", "run/22"]),
        ("run/2/", ["run/2/x"]),
        ("other/", ["other/run/1"]),
        ("zzz", []),
        ("run/1/", []),
    ],
)
def test_list_by_prefix_returns_exactly_that_prefix(storage, prefix, expected):
    for i, key in enumerate(LISTED):
        storage.put(key, data_of(i + 1))
    found = list(storage.list(prefix))
    assert [info.key for info in found] == expected
    for info in found:
        head = storage.head(info.key)
        assert (info.size, info.version) == (head.size, head.version)


def test_sibling_roots_do_not_see_each_other(kind, request, tmp_path):
    one = make_storage(kind, request, tmp_path, "run")
    two = make_storage(kind, request, tmp_path, "run2")
    one.put("a", b"1")
    two.put("a", b"2")
    two.put("b", b"3")
    assert [i.key for i in one.list("")] == ["a"]
    assert [i.key for i in two.list("")] == ["a", "b"]
    assert one.get("a")[0] == b"1"


# -- races -----------------------------------------------------------------------

RACERS = 8


def _race(targets) -> list:
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)

    def run(i, target):
        barrier.wait()
        try:
            results[i] = target()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _probe_on_moto(kind: str, broken: bool, what: str) -> None:
    if kind == "s3" and broken:
        pytest.xfail(f"moto checks conditions without a lock: {what}")


def test_racing_creators_exactly_one_wins(storage, kind):
    results = _race(
        [
            lambda i=i: storage.put_if_absent("lease", f"{i}".encode())
            for i in range(RACERS)
        ]
    )
    winners = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
    losers = [r for r in results if isinstance(r, KeyExistsError)]
    _probe_on_moto(kind, len(winners) != 1, f"{len(winners)} of {RACERS} creators won")
    assert len(winners) == 1 and len(losers) == RACERS - 1, results
    assert storage.get("lease")[0] == str(winners[0]).encode()


def test_racing_compare_and_swap_loses_no_update(storage, kind):
    storage.put("counter", b"0")
    writers, each = 4, 15

    def increment():
        for _ in range(each):
            while True:
                data, info = storage.get("counter")
                try:
                    storage.put_if_match(
                        "counter", b"%d" % (int(data) + 1), info.version
                    )
                    break
                except VersionMismatchError:
                    continue

    results = _race([increment] * writers)
    assert all(r is None for r in results), results
    final = int(storage.get("counter")[0])
    _probe_on_moto(kind, final != writers * each, f"{final} of {writers * each} kept")
    assert final == writers * each


ODD_KEYS = [
    "a b/c d",
    "é/ü.bin",
    "plus+sign",
    "percent%20x",
    "eq=uals&amp",
    "tilde~",
    "semi;colon",
    "q?mark",
    "hash#tag",
    "star*",
]


def test_keys_with_any_printable_characters_round_trip(storage):
    for i, key in enumerate(ODD_KEYS):
        storage.put(key, data_of(i + 1))
    for i, key in enumerate(ODD_KEYS):
        assert storage.get(key)[0] == data_of(i + 1), key
        assert storage.head(key).size == i + 1
    assert [info.key for info in storage.list("")] == sorted(ODD_KEYS)
    assert [info.key for info in storage.list("a b/")] == ["a b/c d"]
    for key in ODD_KEYS:
        assert storage.delete(key), key
    assert list(storage.list("")) == []


@pytest.mark.parametrize("depth", [1, 2])
def test_a_directory_another_writer_makes_between_two_looks_is_taken(tmp_path, depth):
    """``make_dirs`` looks at a missing name following links, then without.

    A directory that another writer creates between those two looks is a
    directory, not a dangling link: the creation goes on (the race that one
    of eight racing creators lost as "exists and is not a directory").
    """
    storage = LocalStorage(tmp_path)
    target = tmp_path.joinpath(*[f"d{i}" for i in range(depth)])
    looked: list[Path] = []
    plain_entry = storage.entry

    def entry(path, *, follow=False):
        found = plain_entry(path, follow=follow)
        if follow and found is None and Path(path) == target and not looked:
            looked.append(Path(path))
            os.makedirs(path)  # the other writer, just after our first look
        return found

    storage.entry = entry
    storage.make_dirs(target / "leaf", durable=True)
    assert looked == [target]
    assert (target / "leaf").is_dir()
