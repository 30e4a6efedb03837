"""Kill torture: a writer SIGKILLed at random times never loses a checkpoint.

A child process (``saver_child.py run``) restores ``latest``, checks its
content and saves 24 MB payloads step after step, synchronously or, in the
``async`` variant, with background saves (``async_save=True``: a step is
reported committed once the save of the next one returned, which waited for
it). The parent kills it with SIGKILL after a random (seeded) delay and starts
it again, round after round. After every kill the parent checks, without
writing anything:

- ``latest`` restores, without any fallback warning, a checkpoint whose
  content is exactly the payload of its step, and no step the child reported
  as committed is newer than it;
- every reported step that retention keeps is still committed (nothing
  committed is lost), every committed checkpoint matches the digest of its
  commit record, the family holds no more checkpoints than
  :func:`retention_bound` allows (the window, plus one per kill between a
  commit and its pruning since a save last pruned), and no payload without a
  record lies below ``latest`` (none that nothing would ever remove);
- the only temporary files are those of the children since the last one
  that committed a checkpoint: a writer sweeps those of earlier children when
  it first saves (the child checks after each save that none is left, with
  background saves none but its own once its first save is done, and the
  parent checks it after a final save).

Kills between a commit and its pruning add up (the family of a store with
``max_keep=2`` can hold 4 checkpoints after two such kills in a row);
:func:`test_kills_between_commit_and_pruning_add_up_until_a_save_prunes`
shows it deterministically, and that the next save that prunes removes them
all.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import threading
import time

import pytest
from helpers import (
    BACKENDS,
    FULL_SIZES,
    backend_case,
    committed_paths,
    committed_steps,
    family,
    is_temp,
    make_payload,
    open_manager,
    payload_mismatches,
    start_saver,
    temporaries,
)

from dp_ckpt_plugin import RestartNotFoundError
from dp_ckpt_plugin.checkpoint.records import read_record, verify

pytestmark = pytest.mark.torture

#: Rounds (one kill each) per backend and retention variant. A torch child
#: spends about two seconds importing torch, so it gets fewer rounds.
#: ``DP_CKPT_TORTURE_ROUNDS=<n>`` sets both, for longer runs by hand.
ROUNDS = {"hdf5": 10, "torch": 8}
if os.environ.get("DP_CKPT_TORTURE_ROUNDS"):
    ROUNDS = dict.fromkeys(ROUNDS, int(os.environ["DP_CKPT_TORTURE_ROUNDS"]))
#: Longest wait between a child's ``ready`` and its kill, in seconds (a save
#: of 24 MB takes about 0.1 s, so a child is killed after 0 to 6 saves).
MAX_DELAY = 0.6
_TEMP_PID = re.compile(r"\.tmp-(\d+)-")


class ChildOutput:
    """Collect the event lines of a child in a thread.

    Parameters
    ----------
    stream : text stream
        The child's stdout.
    """

    def __init__(self, stream):
        self.lines = []
        self.ready = threading.Event()
        self.committed = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            if not line.endswith("\n"):
                break  # cut by the kill
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready "):
                self.ready.set()
            if line.startswith("committed "):
                self.committed.set()
        self.ready.set()
        self.committed.set()

    def join(self):
        """Wait for the end of the stream."""
        self._thread.join(timeout=60)

    def steps(self, tag):
        """Return the steps of the lines ``<tag> <step>``."""
        return [
            int(line.split()[1]) for line in self.lines if line.startswith(f"{tag} ")
        ]


def start_child(directory, backend, max_keep, stderr, background=False):
    """Start ``saver_child.py run`` on ``directory``; return the process.

    Parameters
    ----------
    directory : Path
        The checkpoint directory.
    backend : str
        The serialization backend.
    max_keep : int
        Retention window of the child's manager.
    stderr : file object
        Where the child's stderr goes.
    background : bool
        Whether the child saves in the background (``async_save=True``).
    """
    how = ["async"] if background else []
    return start_saver("run", directory, backend, max_keep, *how, stderr=stderr)


def retention_bound(max_keep, reported_now, held_before):
    """The most committed checkpoints a kill may leave in the family.

    Derived from rules 11-13 of ``docs/guarantees.md``. Pruning is the last
    step of a save (rule 13); once it ran, the family holds at most
    ``max(window, number protected)`` (rule 12), and then the new checkpoint
    is the only one protected: the pointer and the alias name it, and the
    protection of the checkpoint the run resumed from ended with this commit
    of a later step. So:

    - a child that reported a step had a save of its own return, pruning
      included: at the kill the family holds the window plus at most the one
      checkpoint of the save in flight, committed and not yet pruned (a
      background save too: one is in flight at most);
    - a child that reported nothing may still have committed its first step
      and been killed before that save pruned. Nothing prunes when a store
      opens, only after a commit, so that checkpoint comes on top of what the
      earlier children left: kills like this in a row leave the window plus
      one per kill (two in a row: 4 with ``max_keep=2``). The first save that
      completes removes them all (retention plans over every committed
      checkpoint), which the final save of a torture run checks.

    Parameters
    ----------
    max_keep : int
        The child's window (below one keeps all: no bound).
    reported_now : bool
        Whether the child killed last reported a committed step.
    held_before : int
        Committed checkpoints the kill before it left.

    Returns
    -------
    int or None
    """
    if max_keep < 1:
        return None
    if reported_now:
        return max_keep + 1
    return max(max_keep, held_before) + 1


class Tally:
    """What a torture run checked, for its summary line."""

    def __init__(self):
        self.rounds = 0
        self.kills = 0
        self.verified = 0
        self.mid_write = 0
        self.uncommitted = 0
        self.unpublished = 0
        self.stray_records = set()
        self.held = 0
        self.above_window = 0


def check_after_kill(
    manager, backend, max_keep, reported, pids, hashed, tally, *, bound
):
    """Check the store left by the child ``pid``; return the latest step.

    Parameters
    ----------
    manager : CheckpointManager
        Reads the directory (it never writes here).
    backend : str
        The serialization backend (the child writes ``model.ckpt-<step>``).
    max_keep : int
        The child's retention window (below one keeps all).
    reported : set of int
        Every step a child reported as committed, in all rounds.
    pids : list of int
        The children since the last one that committed a checkpoint (that one
        included): a writer sweeps temporary files when it first saves, so
        only theirs may be left.
    hashed : set of tuple
        ``(step, record time)`` of the commits already checked against their
        digest (updated).
    tally : Tally
        Counts what was seen (updated); ``tally.held`` is set to the number of
        committed checkpoints found.
    bound : int or None
        The most committed checkpoints the family may hold
        (:func:`retention_bound`), or ``None`` for no bound.
    """
    directory = manager.directory
    names = os.listdir(directory) if directory.exists() else []
    temps = [name for name in names if is_temp(name)]
    assert {int(_TEMP_PID.search(name).group(1)) for name in temps} <= set(pids), (
        f"temporary files of earlier writers survived: {temps}"
    )
    tally.mid_write += bool(temps)
    committed = committed_paths(directory, backend)
    numbered = {family(backend).step_of(name) for name in names}
    uncommitted = numbered - {None, *committed}
    tally.held = len(committed)
    if bound is not None:
        assert len(committed) <= bound, (sorted(committed), f"at most {bound}")
        tally.above_window += len(committed) > max_keep + 1

    try:
        restored = manager.restore("latest")
    except RestartNotFoundError:
        assert not reported, f"steps {sorted(reported)} were reported, latest is gone"
        assert not committed
        return 0
    latest = restored.step
    assert restored.resolved.warnings == [], restored.resolved.warnings
    assert restored.resolved.checked == "digest"
    assert latest >= max(reported, default=0), "latest went back"
    assert payload_mismatches(restored.state, latest, backend, FULL_SIZES) == []
    tally.verified += 1
    tally.unpublished += max(committed) > latest
    tally.uncommitted += any(step > latest for step in uncommitted)
    # below latest only a kill while pruning could leave one, and no rule would
    # ever remove it: pruning removes a payload before its record
    stray = sorted(step for step in uncommitted if step < latest)
    assert not stray, f"payloads without a record below latest: steps {stray}"
    tally.stray_records.update(
        name
        for name in names
        if name.endswith(".commit.json") and name[1 : -len(".commit.json")] not in names
    )

    if max_keep < 1:
        kept = set(range(1, latest + 1)) | reported
    else:
        kept = {step for step in reported if step > latest - max_keep}
    lost = sorted(kept - committed.keys())
    assert not lost, f"committed checkpoints lost: steps {lost}"
    for step in sorted(committed):  # every commit record tells the truth
        record = read_record(committed[step])
        full = (step, record.created) not in hashed  # new, or saved again
        verify(committed[step], record, digest=full)
        if full:
            hashed.add((step, record.created))
            tally.verified += 1
    return latest


@pytest.mark.parametrize("max_keep", [0, 2], ids=["keep-all", "keep-2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_torture(tmp_path, backend, max_keep):
    """Rules 5-8 and 12 under SIGKILL at random times, round after round."""
    torture(tmp_path, backend, max_keep, background=False)


#: The background variants: torch (half a minute a case) with a window only.
ASYNC_CASES = [
    backend_case("hdf5", 0),
    backend_case("hdf5", 2),
    backend_case("torch", 2),
]


@pytest.mark.parametrize(
    ("backend", "max_keep"),
    ASYNC_CASES,
    ids=["hdf5-keep-all", "hdf5-keep-2", "torch-keep-2"],
)
def test_kill_torture_async(tmp_path, backend, max_keep):
    """The same with background saves: what a child reported committed stays."""
    torture(tmp_path, backend, max_keep, background=True)


def torture(tmp_path, backend, max_keep, *, background):
    """Kill child savers round after round, checking the store after each kill."""
    directory = tmp_path / "models"
    mode = "async" if background else "sync"
    seed = f"torture-{backend}-{max_keep}" + ("-async" if background else "")
    delays = random.Random(seed)
    # the child's own settings (saver_child.py run), for reading only
    manager = open_manager(directory, backend, max_keep=max_keep, verify="digest")
    reported, hashed, tally, pids = set(), set(), Tally(), []
    latest = 0
    started = time.monotonic()
    with open(tmp_path / "child.err", "w+") as stderr:
        for round_ in range(ROUNDS[backend]):
            child = start_child(directory, backend, max_keep, stderr, background)
            output = ChildOutput(child.stdout)
            try:
                assert output.ready.wait(timeout=120), "the child never got ready"
                if round_ == ROUNDS[backend] - 1 and not reported:
                    # a machine so busy that no child committed within
                    # MAX_DELAY of its start: the last one is killed at
                    # random after its first commit, so that the checks of
                    # what a reported commit leaves run at least once
                    assert output.committed.wait(timeout=120), "no commit came"
                time.sleep(delays.uniform(0, MAX_DELAY))
                alive = child.poll() is None
                child.send_signal(signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
                output.join()
                child.stdout.close()
            stderr.seek(0)
            assert alive, f"the child ended early: {output.lines}\n{stderr.read()}"
            assert not [line for line in output.lines if line.startswith("FAIL")]
            # the child resumed from exactly the latest the parent saw
            assert output.steps("ready") == [latest], output.lines
            tally.rounds += 1
            tally.kills += 1
            reported.update(output.steps("committed"))
            pids = [child.pid] if output.steps("committed") else [*pids, child.pid]
            bound = retention_bound(
                max_keep, bool(output.steps("committed")), tally.held
            )
            latest = check_after_kill(
                manager, backend, max_keep, reported, pids, hashed, tally, bound=bound
            )

    # one more save without a kill: every leftover of the killed writers goes
    manager.save(latest + 1, make_payload(latest + 1, backend, FULL_SIZES))
    manager.close()
    assert temporaries(directory) == []
    final = manager.restore("latest")
    assert final.step == latest + 1
    assert payload_mismatches(final.state, latest + 1, backend, FULL_SIZES) == []
    committed = committed_paths(directory, backend)
    if max_keep < 1:
        assert sorted(committed) == list(range(1, latest + 2))
    else:
        assert sorted(committed) == list(
            range(max(1, latest + 2 - max_keep), latest + 2)
        )
    for path in committed.values():
        verify(path, read_record(path), digest=True)
        tally.verified += 1
    shutil.rmtree(directory)

    assert tally.kills >= 1 and reported, "no checkpoint was committed at all"
    print(
        f"\ntorture {backend} {mode} max_keep={max_keep}: {tally.rounds} rounds, "
        f"{tally.kills} kills, {len(reported)} steps reported committed, "
        f"{tally.verified} checkpoint verifications (digest), 0 lost; "
        f"kills that left a torn temporary {tally.mid_write}, an uncommitted "
        f"payload {tally.uncommitted}, a committed but unpublished step "
        f"{tally.unpublished}; records left naming no file by a kill while "
        f"pruning {len(tally.stray_records)}; more than window + 1 left by kills "
        f"between commit and pruning in a row {tally.above_window}; "
        f"{time.monotonic() - started:.1f} s"
    )


def test_kills_between_commit_and_pruning_add_up_until_a_save_prunes(tmp_path):
    """Two writers killed between their commit and their pruning leave window + 2.

    Why ``test_kill_torture[hdf5-keep-2]`` once found 4 checkpoints with
    ``max_keep=2``: rules 12-13 bound the family once a save pruned, and
    pruning comes last, after the commit and the observers; a new writer
    prunes only after its own first commit. Each child here (``saver_child.py
    stall``) resumes from ``latest``, commits and publishes the next step and
    stops in an ``on_commit`` observer, where it is killed: retention never
    ran. The next save that completes brings the family back to the window.
    """
    directory = tmp_path / "models"
    with open_manager(directory, max_keep=2) as manager:
        for step in (1, 2):
            manager.save(step, make_payload(step))
    with open(tmp_path / "child.err", "w+") as stderr:
        for step, held in ((3, [1, 2, 3]), (4, [1, 2, 3, 4])):
            child = start_saver("stall", directory, "hdf5", 2, stderr=stderr)
            try:
                lines = [child.stdout.readline(), child.stdout.readline()]
                child.send_signal(signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
                child.stdout.close()
            stderr.seek(0)
            expected = [f"ready {step - 1}\n", f"published {step}\n"]
            assert lines == expected, stderr.read()
            assert committed_steps(directory) == held
    with open_manager(directory, max_keep=2, verify="digest") as manager:
        assert manager.restore("latest").step == 4
        manager.save(5, make_payload(5))
    assert committed_steps(directory) == [4, 5]
