"""Start ``dp`` commands from a process that has imported torch already.

A ``dp`` process spends seconds importing torch and the libraries deepmd-kit
builds on before it reads its input. The end-to-end tests run a few hundred
``dp`` commands, so :mod:`e2e_support` runs each from a fork of this server
instead of a fresh interpreter: the server imports those third-party
libraries once (never deepmd-kit, never the plugin: both are imported by the
command, after its environment is in place, as in a fresh process), and for
each request forks a process that takes the request's working directory,
environment, arguments and output files and runs the ``dp`` console script
as ``python dp ...`` runs it, exiting as the interpreter does (its non-daemon
threads joined, its ``atexit`` functions run, its output flushed).

What a fork shares with the server and a fresh process would not: the
libraries above already imported, and the seed of ``str`` hashing. What an
interpreter reads at its start (``PYTHON*`` and ``LD_*`` variables) is the
server's: :mod:`e2e_support` uses a server only for commands whose
environment agrees with it there, and a fresh process otherwise.

Protocol, over a Unix socket, one connection per command: the client sends
one JSON line ``{"argv", "cwd", "env", "stdout", "stderr"}``; the server
answers ``{"pid": N}`` once the command's process runs, then
``{"returncode": N}`` (negative: killed by that signal) when it ends.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys

#: What a ``dp`` command imports first, and what takes its start the longest.
PRELOAD = (
    "numpy",
    "scipy",
    "h5py",
    "ml_dtypes",
    "torch",
    "torch._dynamo",
    "torch.distributed.checkpoint",
)


def run_command(request: dict) -> None:
    """In the forked process: become the command and run it to its exit."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    with open(os.devnull, "rb") as stdin:
        os.dup2(stdin.fileno(), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        with open(path, "wb") as handle:
            os.dup2(handle.fileno(), fd)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        import runpy

        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finish(code)


def exit_code(value: object) -> int:
    """The exit status ``sys.exit(value)`` gives."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    """Exit as the interpreter does after its main module: threads, atexit, flush."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # joins the non-daemon threads, as at exit
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def serve(connection: socket.socket) -> None:
    """In a child of the server: run one command and report on it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    reader = connection.makefile("rb")
    request = json.loads(reader.readline())
    pid = os.fork()
    if pid == 0:
        reader.close()
        connection.close()
        run_command(request)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps({"returncode": returncode}).encode() + b"\n")


def main(path: str) -> None:
    with contextlib.suppress(Exception):  # Linux: end with the tests' process
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped unasked
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        connection, _ = server.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            try:
                serve(connection)
            finally:
                os._exit(0)
        connection.close()


if __name__ == "__main__":
    main(sys.argv[1])
