"""A remote store owns only the keys of its grammar (rule 45), generated.

Every key shape that is not the store's own (a nested store under an epoch
folder or beside it, a user's object, a name that is almost a checkpoint
name, ``..``, double and trailing slashes, unicode, the names HEAD, LEASE
and archives) is tried at every place a key is read: HEAD's entries, its
published key and its archives, an archive's entries, a recovery listing
(on the in-process storage, for the combinations) and the incomplete
multipart uploads (on moto's S3 server). The foreign objects must still be
there byte for byte and the foreign uploads still listed; a HEAD naming a
foreign key is refused in one line, and nothing is deleted by it.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest
from doubles.memory import MemoryStorage, forget
from helpers import gone_holder, make_payload, plugin_manager, remote_store

from dp_ckpt_plugin.commands import main
from dp_ckpt_plugin.errors import CheckpointError
from dp_ckpt_plugin.remote import head as heads
from dp_ckpt_plugin.remote.keys import (
    ARCHIVE,
    HEAD,
    HEAD_KEY,
    LEASE,
    LEASE_KEY,
    PAYLOAD,
    PROBE,
    RECORD,
    SEGMENT,
    parse_key,
)
from dp_ckpt_plugin.remote.recovery import recover

PREFIX = "model.ckpt"

#: Keys that are the store's own, with their kind.
OURS = {
    "HEAD": HEAD,
    "LEASE": LEASE,
    "archive/20261203T101500Z.json": ARCHIVE,
    ".probe/123-0a1b2c3d": PROBE,
    "e000001/model.ckpt-30.h5": PAYLOAD,
    "e000001/.model.ckpt-30.h5.commit.json": RECORD,
    "e000002/v1/model.ckpt-0.pt": PAYLOAD,
    "e000002/v12/.model.ckpt-0.pt.commit.json": RECORD,
    "e1234567/best.ckpt-9.pt": PAYLOAD,
    "e000001/modèle.ckpt-3.h5": PAYLOAD,
    "catalogue/e000001-0.json": SEGMENT,
    "catalogue/e000003-17.json": SEGMENT,
}

#: Foreign keys an object store can hold under ``U`` (and the memory storage
#: can write), by the shape of their class.
FOREIGN_OBJECTS = {
    "a nested store under an epoch folder": [
        "e000001/sub/HEAD",
        "e000001/sub/LEASE",
        "e000001/sub/e000001/model.ckpt-1.h5",
        "e000001/sub/e000001/.model.ckpt-1.h5.commit.json",
        "e000001/sub/archive/20260101T000000Z.json",
    ],
    "a nested store at an epoch folder": [
        "e000001/HEAD",
        "e000001/LEASE",
        "e000001/e000001/model.ckpt-1.h5",
        "e000001/archive/20260101T000000Z.json",
    ],
    "a nested store at U/sub/": [
        "sub/HEAD",
        "sub/LEASE",
        "sub/e000001/model.ckpt-1.h5",
        "sub/e000001/.model.ckpt-1.h5.commit.json",
    ],
    "a user's object": [
        "e000001/notes.txt",
        "e000001/README",
        "notes/by-a-user.txt",
        "elsewhere/e000001/model.ckpt-1.h5",
    ],
    "almost a checkpoint name": [
        "e000001/model.ckpt-01.h5",
        "e000001/model.ckpt-1.h5.tmp",
        "e000001/model.ckpt-1",
        "e000001/model.ckpt-1e3.h5",
        "e000001/model.ckpt-+1.h5",
        "e000001/-1.h5",
        "e000001/.model.ckpt-1.h5.commit.json.bak",
        "e000001/.model.ckpt-01.h5.commit.json",
        "e000001/v0/model.ckpt-1.h5",
        "e000001/v01/model.ckpt-1.h5",
        "e000001/x/model.ckpt-1.h5",
        "e000001/v1/v1/model.ckpt-1.h5",
        "e1/model.ckpt-1.h5",
        "e0000001/model.ckpt-1.h5",
        "E000001/model.ckpt-1.h5",
        "e000001x/model.ckpt-1.h5",
    ],
    "unicode": [
        "e000001/ünïcödé.txt",
        "e000001/model\u202e.ckpt-1.h5",
        "e000001/model.ckpt-1.h5\u200b",
        "e000001/model.ckpt-\u0661.h5",  # an Arabic-Indic digit one
    ],
    "store names one level down": [
        "e000001/v1/HEAD",
        "archive/x.json",
        "archive/20260101T000000Z.json.bak",
        "archive/sub/20260101T000000Z.json",
        ".probe/x",
    ],
    "almost a catalogue segment": [
        "catalogue/e000001-01.json",
        "catalogue/e1-0.json",
        "catalogue/e000001-0.json.bak",
        "catalogue/sub/e000001-0.json",
        "catalogue/x.json",
        "e000001/catalogue/e000001-0.json",
    ],
}
FOREIGN = [k for keys in FOREIGN_OBJECTS.values() for k in keys]

#: Keys no storage here can hold, but a HEAD, an archive or an S3 listing can name.
UNWRITABLE = [
    "../x",
    "e000001/../HEAD",
    "e000001/./model.ckpt-1.h5",
    "e000001//model.ckpt-1.h5",
    "e000001/model.ckpt-1.h5/",
    "/e000001/model.ckpt-1.h5",
    "s3://bucket/run/e000001/model.ckpt-1.h5",
    "memory://bucket/run/e000001/model.ckpt-1.h5",
    "e000001/model.ckpt-1.h5\x00",
    "e000001/model.ckpt-1.h5\n",
    "e000001\\model.ckpt-1.h5",
    "",
    "e000001/" + "m" * 5000 + "-1.h5",
]
#: What a HEAD entry may name that is not ours: the store's own non-payload
#: keys count (HEAD, LEASE, an archive), and a record is not a payload.
NOT_PAYLOADS = [
    *FOREIGN,
    *UNWRITABLE,
    "HEAD",
    "LEASE",
    "archive/20261203T101500Z.json",
    ".probe/123-0a1b2c3d",
    "e000001/.model.ckpt-1.h5.commit.json",
    "catalogue/e000001-0.json",
]


@pytest.mark.parametrize("key,kind", sorted(OURS.items()))
def test_the_grammar_reads_the_stores_own_keys(key, kind):
    parsed = parse_key(key)
    assert parsed is not None and parsed.kind == kind and parsed.text == key
    if kind in (PAYLOAD, RECORD):
        assert parsed.payload.record.text == parsed.record.text
        assert parse_key(parsed.payload.text).kind == PAYLOAD
        assert parse_key(parsed.record.text).kind == RECORD


@pytest.mark.parametrize("key", [*FOREIGN, *UNWRITABLE, None, 3, b"HEAD"])
def test_the_grammar_refuses_every_other_key(key):
    assert parse_key(key) is None


# -- a store with an older epoch's leftovers ---------------------------------------


def _fill(storage, keys):
    """Foreign objects at ``keys``, each with bytes of its own."""
    placed = {}
    for index, key in enumerate(keys):
        data = f"not yours {index}: {key}".encode()
        storage.put(key, data)
        placed[key] = data
    return placed


def _snapshot(storage):
    return {i.key: storage.get(i.key, 1 << 30)[0] for i in storage.list("")}


def _intact(storage, placed):
    for key, data in placed.items():
        found = storage.get(key, 1 << 30)
        assert found is not None, f"{key!r} was removed"
        assert found[0] == data, f"{key!r} was changed"


@pytest.fixture(params=["run", ""], ids=["under-a-prefix", "at-the-bucket-root"])
def store_storage(request):
    bucket = f"k{secrets.token_hex(4)}"
    url = f"memory://{bucket}/{request.param}".rstrip("/")
    yield MemoryStorage(url)
    forget(bucket)


def _two_runs(tmp_path, storage, placed_keys):
    """A run of epoch 1, the foreign objects, then a run of epoch 2 (recovery)."""
    pm = plugin_manager()
    with remote_store(pm, tmp_path / "a", storage, keep=0) as store:
        for step in (1, 2):
            store.save(step, make_payload(step))
            store.remote.flush(30)
    placed = _fill(storage, placed_keys)
    # what a dead writer of epoch 1 left, ours and unnamed: recovery removes it
    storage.put("e000001/model.ckpt-7.h5", b"torn")
    storage.put("e000001/.model.ckpt-7.h5.commit.json", b"{}")
    storage.put("e000001/v3/model.ckpt-7.h5", b"torn again")
    with remote_store(pm, tmp_path / "b", storage, keep=0) as store:
        store.open()
    return placed


@pytest.mark.parametrize("shape", sorted(FOREIGN_OBJECTS))
def test_recovery_removes_only_its_own_unnamed_keys(tmp_path, store_storage, shape):
    placed = _two_runs(tmp_path, store_storage, FOREIGN_OBJECTS[shape])
    _intact(store_storage, placed)
    for gone in (
        "e000001/model.ckpt-7.h5",
        "e000001/.model.ckpt-7.h5.commit.json",
        "e000001/v3/model.ckpt-7.h5",
    ):
        assert store_storage.head(gone) is None, gone
    head, _ = heads.read(store_storage)
    assert all(store_storage.head(k) is not None for k in head.referenced())


def test_a_store_at_the_root_leaves_other_prefixes_alone(tmp_path):
    bucket = f"k{secrets.token_hex(4)}"
    root = MemoryStorage(f"memory://{bucket}")
    nested = MemoryStorage(f"memory://{bucket}/e000001/sub")
    try:
        pm = plugin_manager()
        with remote_store(pm, tmp_path / "n", nested, keep=0) as store:
            for step in (1, 2):
                store.save(step, make_payload(step))
                store.remote.flush(30)
        before = _snapshot(nested)
        for run in ("a", "b", "c"):  # three epochs of the store at the root
            with remote_store(pm, tmp_path / run, root, keep=0) as store:
                store.save(1, make_payload(1))
                store.remote.flush(30)
        assert _snapshot(nested) == before
        assert heads.read(nested)[0].family(PREFIX).published.step == 2
    finally:
        forget(bucket)


# -- a HEAD, or an archive, naming a key that is not ours ----------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The objects of a store with steps 1-2 (epoch 1), and foreign objects."""
    bucket = f"k{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    with remote_store(
        plugin_manager(),
        tmp_path_factory.mktemp("w"),
        storage,
        keep=0,
        holder=gone_holder(),
    ) as store:
        for step in (1, 2):
            store.save(step, make_payload(step))
            store.remote.flush(30)
    _fill(storage, FOREIGN)
    objects = _snapshot(storage)
    forget(bucket)
    return objects


def _naming(document, place, key):
    """HEAD's ``document`` with ``place`` naming ``key``."""
    doc = json.loads(json.dumps(document))
    family = doc["families"][PREFIX]
    entry = family["kept"][0 if place == "kept" else -1]
    if place in ("kept", "latest"):
        if place == "latest":
            family["latest"] = key
        entry["key"] = key
        entry["name"] = key.rpartition("/")[2] if isinstance(key, str) else key
    elif place == "archives":
        doc["archives"] = [key]
    return doc


PLACES = ["kept", "latest", "archives"]


def _one_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("key", NOT_PAYLOADS)
def test_a_head_naming_a_foreign_key_is_refused_and_deletes_nothing(
    written, place, key, tmp_path, capsys
):
    if (
        place == "archives"
        and parse_key(key) is not None
        and parse_key(key).kind == ARCHIVE
    ):
        pytest.skip("an archive key is what archives name")
    bucket = f"k{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        for k, data in written.items():
            storage.put(k, data)
        document = json.loads(written[HEAD_KEY])
        storage.put(HEAD_KEY, json.dumps(_naming(document, place, key)).encode())
        before = _snapshot(storage)
        # a reader
        with (
            pytest.raises(CheckpointError) as refused,
            remote_store(plugin_manager(), tmp_path / "r", storage) as store,
        ):
            store.resolve("latest")
        line = str(refused.value)
        assert "\n" not in line and "\x00" not in line and storage.url in line
        assert isinstance(key, str) and (
            key == "" or key not in line or key.isprintable()
        )
        # dp-ckpt prune and ls
        assert main(["prune", storage.url, "--keep-last", "1"]) != 0
        assert "memory://" in _one_line(capsys.readouterr().err)
        assert main(["ls", storage.url]) != 0
        _one_line(capsys.readouterr().err)
        after = _snapshot(storage)
        assert after.keys() - {LEASE_KEY} == before.keys() - {LEASE_KEY}
        assert {k: v for k, v in after.items() if k != LEASE_KEY} == {
            k: v for k, v in before.items() if k != LEASE_KEY
        }
    finally:
        forget(bucket)


@pytest.mark.parametrize("key", NOT_PAYLOADS)
def test_an_archive_naming_a_foreign_key_keeps_everything(written, key, tmp_path):
    """An archive HEAD lists is read for what it names: one naming a foreign key
    is unreadable, so recovery removes nothing; foreign objects stay."""
    bucket = f"k{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        for k, data in written.items():
            storage.put(k, data)
        document = json.loads(written[HEAD_KEY])
        archive = _naming(document, "kept", key)
        storage.put("archive/20260101T000000Z.json", json.dumps(archive).encode())
        document["archives"] = ["archive/20260101T000000Z.json"]
        storage.put(HEAD_KEY, json.dumps(document).encode())
        storage.put("e000001/model.ckpt-7.h5", b"torn")
        before = _snapshot(storage)
        head, _ = heads.read(storage)
        done = recover(storage, head, 2)
        assert done.objects == 0 and _snapshot(storage) == before
    finally:
        forget(bucket)


# -- incomplete multipart uploads (moto) ---------------------------------------------

#: Foreign upload keys, relative to ``U``, by shape (one of each class, and the
#: shapes only S3 can hold).
FOREIGN_UPLOADS = [
    "e000001/sub/e000003/model.ckpt-1.h5",
    "e000001/sub/HEAD",
    "e000001/notes.txt",
    "e000001/model.ckpt-01.h5",
    "e000001//model.ckpt-1.h5",
    "e000001/model.ckpt-1.h5/",
    "e000001/ünïcödé.txt",
    "sub/e000001/model.ckpt-1.h5",
    "e1/model.ckpt-1.h5",
]


def _start_upload(s3_bucket, key):
    client = s3_bucket.server.client()
    found = client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)
    return found["UploadId"]


def _uploads(s3_bucket):
    return sorted((u["Key"], u["UploadId"]) for u in s3_bucket.uploads())


def test_recovery_aborts_only_its_own_older_uploads_begun_before_it(
    s3_bucket, tmp_path
):
    from dp_ckpt_plugin.objectstore.registry import storage_for

    storage = storage_for(s3_bucket.url)
    pm = plugin_manager()
    with remote_store(pm, tmp_path / "a", storage, keep=0) as store:
        store.save(1, make_payload(1))
        store.remote.flush(60)
    p = s3_bucket.prefix
    foreign = [f"{p}/{k}" for k in FOREIGN_UPLOADS]
    foreign += [  # other prefixes of the bucket, and the store's own of epoch 2+
        f"{p}x/e000001/model.ckpt-1.h5",
        "e000001/model.ckpt-1.h5",
        f"other/{p}/e000001/model.ckpt-1.h5",
        f"{p}/e000002/model.ckpt-9.h5",
    ]
    spared = sorted((k, _start_upload(s3_bucket, k)) for k in foreign)
    ours = [f"{p}/e000001/model.ckpt-9.h5", f"{p}/e000001/v2/model.ckpt-9.h5"]
    for key in ours:
        _start_upload(s3_bucket, key)
    with remote_store(pm, tmp_path / "b", storage, keep=0) as store:
        store.open()
    assert _uploads(s3_bucket) == spared


def test_recovery_spares_uploads_begun_after_the_takeover(s3_bucket, tmp_path):
    from dp_ckpt_plugin.objectstore.registry import storage_for

    storage = storage_for(s3_bucket.url)
    key = f"{s3_bucket.prefix}/e000001/model.ckpt-9.h5"
    upload = _start_upload(s3_bucket, key)
    # moto dates every upload at one fixed time: a lease taken before it
    initiated = s3_bucket.uploads()[0]["Initiated"].timestamp()
    head = heads.Head(epoch=1)
    long_ago = lambda: time.time() - initiated + 3600  # noqa: E731
    assert recover(storage, head, 2, held_for=long_ago).uploads == 0
    assert _uploads(s3_bucket) == [(key, upload)]
    assert recover(storage, head, 1, held_for=lambda: 0.0).uploads == 0  # epoch 1's own
    assert recover(storage, head, 2, held_for=lambda: 0.0).uploads == 1
    assert _uploads(s3_bucket) == []


#: Objects only S3 can hold (empty, dot and trailing segments), relative to ``U``.
S3_ONLY_OBJECTS = [
    "e000001//model.ckpt-1.h5",
    "e000001/model.ckpt-1.h5/",
    "e000001/./model.ckpt-1.h5",
    "e000001/../HEAD",
    "e000001/sub/HEAD",
    "e000001/notes.txt",
]


def test_recovery_on_s3_leaves_objects_only_s3_can_hold(s3_bucket, tmp_path):
    from dp_ckpt_plugin.objectstore.registry import storage_for

    storage = storage_for(s3_bucket.url)
    pm = plugin_manager()
    with remote_store(pm, tmp_path / "a", storage, keep=0) as store:
        store.save(1, make_payload(1))
        store.remote.flush(60)
    client = s3_bucket.server.client()
    placed = {}
    for index, key in enumerate(S3_ONLY_OBJECTS):
        full = f"{s3_bucket.prefix}/{key}"
        placed[full] = f"not yours {index}".encode()
        client.put_object(Bucket=s3_bucket.name, Key=full, Body=placed[full])
    storage.put("e000001/model.ckpt-7.h5", b"torn")  # ours, unnamed: removed
    with remote_store(pm, tmp_path / "b", storage, keep=0) as store:
        store.open()
    for full, data in placed.items():
        found = client.get_object(Bucket=s3_bucket.name, Key=full)["Body"].read()
        assert found == data, full
    assert storage.head("e000001/model.ckpt-7.h5") is None


def test_a_store_at_the_bucket_root_aborts_no_other_prefixs_upload(s3_bucket, tmp_path):
    from dp_ckpt_plugin.objectstore.registry import storage_for

    storage = storage_for(f"s3://{s3_bucket.name}")
    pm = plugin_manager()
    with remote_store(pm, tmp_path / "a", storage, keep=0) as store:
        store.save(1, make_payload(1))
        store.remote.flush(60)
    foreign = [
        "run/e000001/model.ckpt-9.h5",  # a store under run/: its live upload
        "run/HEAD",
        "other/e000001/model.ckpt-9.h5",
        "e000001/sub/e000001/model.ckpt-1.h5",
        "e000001/model.ckpt-1.h5.tmp",
    ]
    spared = sorted((k, _start_upload(s3_bucket, k)) for k in foreign)
    _start_upload(s3_bucket, "e000001/model.ckpt-9.h5")  # the root store's own
    with remote_store(pm, tmp_path / "b", storage, keep=0) as store:
        store.open()
    assert _uploads(s3_bucket) == spared


@pytest.mark.parametrize("key", [k for k in NOT_PAYLOADS if k])
def test_a_record_naming_a_foreign_key_is_skipped_and_nothing_is_touched(
    written, key, tmp_path
):
    """The record of the newest names a foreign key as its checkpoint: the
    newest is not used (the reader falls back to step 1), nothing foreign is
    fetched, and nothing is deleted."""
    bucket = f"k{secrets.token_hex(4)}"
    storage = MemoryStorage(f"memory://{bucket}/run")
    try:
        for k, data in written.items():
            storage.put(k, data)
        head = heads.Head.parse(written[HEAD_KEY], "HEAD")
        newest = head.family(PREFIX).published
        record_at = newest.keys[1]
        record = json.loads(written[record_at])
        record["name"] = key
        storage.put(record_at, json.dumps(record).encode())
        before = _snapshot(storage)
        with remote_store(plugin_manager(), tmp_path / "r", storage) as store:
            found = store.resolve("latest")
        assert found.step == 1 and found.fell_back
        older = head.family(PREFIX).kept[0]
        assert found.path.read_bytes() == written[older.key]  # step 1 itself
        after = _snapshot(storage)
        fenced = (HEAD_KEY, LEASE_KEY)
        assert {k: v for k, v in after.items() if k not in fenced} == {
            k: v for k, v in before.items() if k not in fenced
        }
    finally:
        forget(bucket)
