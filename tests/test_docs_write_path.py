"""What the docs say of the write path is what the code does: digest and fsyncs.

In the manner of ``test_docs_truth.py``: the claims are found in the pages
themselves, and the code is run to say what is true.

- **The digest.** A payload's digest is read back from a read-only map of the
  file once the format has written it (the page cache, no copy), on a
  thread of its own beside the fsync for a large payload. A save through the
  store is recorded to show it; every page that says when the digest is
  computed must say that, and none may say it is computed while the file is
  written (the way before, which a page may name as such).
- **The fsyncs.** A steady save with retention is recorded, fsync by fsync,
  through ``CheckpointManager`` and through the store the ``dp`` host builds;
  every count the pages give ("4 fsyncs a steady save", "**4** fsync-class
  calls", "6 in all") and every order they list (the summary in
  ``durability.md`` and ``architecture.md``, the numbered steps of a first
  save and of publication) must be the recorded one.
"""

from __future__ import annotations

import mmap
import re
import threading
from pathlib import Path

import pytest
from helpers import make_payload, open_manager, plugin_manager

from dp_ckpt_plugin.checkpoint.layout import record_target
from dp_ckpt_plugin.storage.local import LocalStorage
from dp_ckpt_plugin.storage.temp import temp_target

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += sorted((ROOT / "docs").glob("*.rst"))


def text_of(page: Path) -> str:
    return " ".join(page.read_text("utf-8").split())


def sentences(page: Path) -> list[str]:
    return re.split(r"(?<=[.;])\s+(?=[A-Z`*(\[])", text_of(page))


# -- what the code does ---------------------------------------------------------------


class Recorder(LocalStorage):
    """A storage that notes each fsync (what it made durable) and each digest."""

    def __init__(self, root, *, mirrors=()) -> None:
        super().__init__(root, mirrors=mirrors)
        self.fsyncs: list[tuple[str, Path]] = []
        self.digests: list[dict] = []
        self._writing = False

    def _sys_fsync(self, fd, path):
        self.fsyncs.append(("data", Path(path)))
        if (temp_target(Path(path).name) or "").startswith("model.ckpt-"):
            self.payload_fsync_thread = threading.get_ident()
        super()._sys_fsync(fd, path)

    def _sys_fsync_dir(self, directory):
        self.fsyncs.append(("dir", Path(directory)))
        super()._sys_fsync_dir(directory)

    def write_payload(self, path, writer, *, durable, digest, **more):
        def writing(handle):
            self._writing = True
            try:
                return writer(handle)
            finally:
                self._writing = False

        def hashing(view):
            self.digests.append(
                {
                    "during the write": self._writing,
                    "mapped": isinstance(view.obj, mmap.mmap),
                    "read only": view.readonly,
                    "thread": threading.get_ident(),
                    "size": view.nbytes,
                }
            )
            return digest(view)

        return super().write_payload(
            path, writing, durable=durable, digest=hashing, **more
        )


def what(kind: str, path: Path, directory: Path) -> str:
    """The word the pages use for what one fsync made durable."""
    if kind == "dir":
        return "D" if path == directory else "the working directory"
    final = temp_target(path.name) or path.name
    if record_target(final) is not None:
        return "record"
    if final.startswith("model.ckpt-"):
        return "payload"
    return "pointer"


def steady_save(tmp_path: Path, *, host: bool) -> list[str]:
    """The fsyncs of a save of step 3 with retention (two kept), in order."""
    directory = tmp_path / "models"
    if host:
        from dp_ckpt_plugin.deepmd.settings import read_settings
        from dp_ckpt_plugin.store.core import CheckpointStore

        config = {"training": {"save_dir": str(directory), "_dp_ckpt": {}}}
        settings = read_settings(config, suffix=".h5", cwd=tmp_path)
        families = settings.family_configs()
        from dp_ckpt_plugin.retention import KeepLast

        for config in families:
            config.policy = KeepLast(2)
        mirrors = [m.path for c in families for m in c.mirrors]
        storage = Recorder(directory, mirrors=mirrors)
        store = CheckpointStore(
            directory,
            format="hdf5",
            pm=plugin_manager(),
            families=families,
            storage=storage,
        )
        save = store.save
    else:
        storage = Recorder(directory)
        store = open_manager(directory, storage=storage, max_keep=2)
        save = store.save
    try:
        for step in (1, 2):
            save(step, make_payload(step))
        storage.fsyncs.clear()
        save(3, make_payload(3))
        made = list(storage.fsyncs)
    finally:
        store.close()
    return canonical([what(kind, path, directory) for kind, path in made])


def canonical(made: list[str]) -> list[str]:
    """The fsyncs in the order the pages list them, where some run at once.

    The payload's, the record's and the first of ``D`` run at once (three
    threads, in no fixed order), as do the second of ``D`` and a mirrored
    pointer's; the pages list each group in one order.
    """
    first = sorted(made[:3], key=["payload", "record", "D"].index)
    rest = made[3:]
    if sorted(rest[:2]) == ["D", "pointer"]:
        rest = ["D", "pointer", *rest[2:]]
    return first + rest


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return {
        "manager": steady_save(tmp_path_factory.mktemp("manager"), host=False),
        "host": steady_save(tmp_path_factory.mktemp("host"), host=True),
    }


def test_what_was_recorded(recorded):
    """The recordings the claims are held against (printed when they change)."""
    assert recorded["manager"][:3] == ["payload", "record", "D"], recorded
    assert set(recorded["host"]) >= set(recorded["manager"]), recorded


@pytest.mark.parametrize("size", [64 << 10, 8 << 20])
def test_the_digest_is_read_back_from_a_map_after_the_write(tmp_path, size):
    import numpy as np

    storage = Recorder(tmp_path / "models")
    with open_manager(tmp_path / "models", storage=storage) as m:
        m.save(1, {"w": np.zeros(size // 8)})
    (digest,) = storage.digests
    assert digest["mapped"] and digest["read only"], digest
    assert not digest["during the write"], digest
    assert digest["size"] >= size
    # the payload's fsync runs on a thread of its own, beside the hash (and
    # the record's fsyncs), whatever the size
    assert digest["thread"] != storage.payload_fsync_thread, digest


# -- what the pages say ---------------------------------------------------------------

#: Saying the digest is computed as the file is written (the old way).
WHILE_WRITTEN = re.compile(
    r"(digest|hash)[^.;]*?(while (it|the file) is (being )?written|as it is written"
    r"|while writing|on (its|their) way out)",
    re.IGNORECASE,
)
#: Saying it is read back from a map of the written file.
READ_BACK = re.compile(
    r"(digest|hash)[^.;]*?(read back from (a|the) (read-only )?map|from a read-only "
    r"map|from the page cache|hashed from the page cache)",
    re.IGNORECASE,
)
#: The pages that say how a checkpoint's digest is made, for users and maintainers.
SAYS_HOW = ["README.md", "guarantees.md", "architecture.md", "performance.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_says_the_digest_is_computed_while_the_file_is_written(page):
    wrong = [
        s
        for s in sentences(page)
        if WHILE_WRITTEN.search(s) and "the old way" not in s and "cost" not in s
    ]
    assert wrong == [], f"{page.name}: the digest is read back after the write"


@pytest.mark.parametrize("name", SAYS_HOW)
def test_the_pages_say_the_digest_is_read_back_from_a_map(name):
    page = next(p for p in PAGES if p.name == name)
    assert any(READ_BACK.search(s) for s in sentences(page)), name


def counts_claimed() -> list[tuple[str, str, int]]:
    """``(page, which store, count)`` of every count of a steady save's fsyncs."""
    found = []
    for page in PAGES:
        text = text_of(page)
        for claim in re.finditer(r"(\d+) fsyncs a steady save", text):
            found.append((page.name, "manager", int(claim[1])))
        for claim in re.finditer(
            r"steady save[^.]*?makes \**(\d+)\** fsync-class calls", text
        ):
            found.append((page.name, "manager", int(claim[1])))
        for claim in re.finditer(r"with retention: (\d+) fsync-class calls", text):
            found.append((page.name, "manager", int(claim[1])))
        for claim in re.finditer(
            r"adds (\d+) for deepmd-kit's working-directory mirrors[^.]*?(\d+) in all",
            text,
        ):
            found.append((page.name, "host - manager", int(claim[1])))
            found.append((page.name, "host", int(claim[2])))
        for claim in re.finditer(r"(\d+) through the store the `dp` host builds", text):
            found.append((page.name, "host", int(claim[1])))
    return found


def test_every_count_of_a_steady_saves_fsyncs_is_what_it_makes(recorded):
    claims = counts_claimed()
    pages = {page for page, _, _ in claims}
    assert {"durability.md", "performance.md", "architecture.md"} <= pages, claims
    made = {
        "manager": len(recorded["manager"]),
        "host": len(recorded["host"]),
        "host - manager": len(recorded["host"]) - len(recorded["manager"]),
    }
    wrong = [(page, which, n) for page, which, n in claims if n != made[which]]
    assert wrong == [], f"the code makes {made}"


def words(listing: str) -> list[str]:
    """The fsyncs a page lists, in its order, as :func:`what` names them."""
    found = []
    for word in re.finditer(
        r"(payload|record)'s (data|temporary file)|`D`|the directory"
        r"|\b(payload|record)\b(?!')",
        listing,
    ):
        token = word[1] or word[3] or "D"
        found.append(token)
    return found


def test_the_orders_listed_are_the_order_of_the_fsyncs(recorded):
    durability = text_of(ROOT / "docs" / "durability.md")
    architecture = text_of(ROOT / "docs" / "architecture.md")
    performance = text_of(ROOT / "docs" / "performance.md")
    listings = {
        "durability.md summary": re.search(
            r"fsync-class calls \([^)]*\): (.*?)\. The store's own", durability
        ),
        "architecture.md": re.search(
            r"steady save with retention thus makes \d+ fsync-class calls: (.*?) \(",
            architecture,
        ),
        "performance.md": re.search(
            r"fsyncs a steady save\*\* \([^)]*\): (.*?); a prune", performance
        ),
    }
    for name, found in listings.items():
        assert found is not None, f"{name}: the order of a steady save's fsyncs"
        assert words(found[1]) == recorded["manager"], (name, found[1])


def test_the_steps_of_a_first_save_and_of_publication_are_in_the_code_order(
    recorded,
):
    page = (ROOT / "docs" / "durability.md").read_text("utf-8")
    first = page.split("### A first save of a step", 1)[1].split("###", 1)[0]
    publication = page.split("### Publication", 1)[1].split("###", 1)[0]
    commit = [words(b)[0] for b in re.findall(r"\*\*fsync of ([^*]+)\*\*", first)]
    published = re.findall(r"\*\*(one fsync of the directory)\*\*", publication)
    listed = commit + ["D"] * len(published[:1])
    assert listed == recorded["manager"], (listed, recorded["manager"])
