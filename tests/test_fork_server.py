"""The fork server the end-to-end tests start ``dp`` from runs a command as a
fresh interpreter would: same working directory, arguments, environment,
``sys.path[0]``, output, exit status, threads joined and ``atexit`` run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from e2e_support import ForkServer, dp_env

SCRIPT = textwrap.dedent(
    """
    import atexit, json, os, sys, threading, time
    def late():
        time.sleep(0.2)
        print("thread joined", flush=True)
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran"))
    print(json.dumps({
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "marker": os.environ.get("FORK_SERVER_MARKER"),
        "path0": sys.path[0],
        "main": __name__,
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.fixture(scope="module")
def server():
    started = ForkServer(dp_env())
    yield started
    started.stop()


@pytest.mark.parametrize("status", ["0", "3"])
def test_a_command_runs_as_in_a_fresh_interpreter(server, tmp_path, status):
    script = tmp_path / "bin" / "command"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    env = dp_env(FORK_SERVER_MARKER="here")
    argv = [str(script), status, "x y"]
    forked = server.run(argv, work, env, timeout=60)
    fresh = subprocess.run(
        [sys.executable, *argv], cwd=work, env=env, capture_output=True, text=True
    )
    assert forked.returncode == fresh.returncode == int(status)
    assert forked.stdout == fresh.stdout
    assert forked.stderr == fresh.stderr == "to stderr\n"
    assert '"marker": "here"' in forked.stdout
    assert forked.stdout.splitlines()[-2:] == ["thread joined", "atexit ran"]


def test_a_command_past_its_timeout_is_killed(server, tmp_path):
    script = tmp_path / "sleeper"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        server.run([str(script)], tmp_path, dp_env(), timeout=1)
