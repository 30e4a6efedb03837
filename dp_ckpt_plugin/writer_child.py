"""The writer process: serializes, writes, hashes and fsyncs a payload.

Started by :class:`~dp_ckpt_plugin.writer_process.WriterProcess` as
``python -m dp_ckpt_plugin.writer_child <fd of messages> <fd of buffers> <D>``.
It maps the shared snapshot buffers it is sent (once each), rebuilds the
payload around them and writes it with the torch format through a
:class:`~dp_ckpt_plugin.storage.local.LocalStorage` confined to the store
directory ``D``, exactly as the store would in its own process; it answers
with the temporary file and its digest, or the error. The store does the
rest (record, move, publication, retention).

It ignores ``SIGINT`` (a Ctrl-C reaches the whole foreground process group;
the store decides when its writer stops) and ends when told to, or when the
store's process is gone (its end of the socket closes).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import signal
import socket
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds
from pathlib import Path


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, buffers: dict) -> None:
        super().__init__(io.BytesIO(data))
        self.buffers = buffers

    def persistent_load(self, pid):
        import torch

        _, ident, dtype, shape, kind, grad = pid
        mapped = self.buffers[ident]
        dtype = getattr(torch, dtype)
        count = 1
        for n in shape:
            count *= n
        tensor = torch.frombuffer(mapped, dtype=dtype, count=count).view(shape)
        if kind == "parameter":
            return torch.nn.Parameter(tensor, requires_grad=grad)
        return tensor


def serve(conn: Connection, fds: socket.socket, root: Path) -> None:
    """Answer write requests until told to stop or the store is gone."""
    from .digests import digest_of_view
    from .formats import torch as torch_format
    from .storage.local import LocalStorage

    storage = LocalStorage(root)
    buffers: dict[int, mmap.mmap] = {}
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if message["op"] == "exit":
            return
        if message["op"] == "ping":
            conn.send_bytes(pickle.dumps(("ok",)))
            continue
        new = message["new"]
        if new:
            received = recvfds(fds, len(new))
            for ident, fd in zip(new, received, strict=True):
                buffers[ident] = mmap.mmap(fd, 0)
                os.close(fd)
        state = None
        try:
            state = _Unpickler(message["payload"], buffers).load()

            def write(handle, state=state, step=message["step"]):
                torch_format.on_save_step("torch", step, state, handle)

            tmp, digest = storage.write_payload(
                Path(message["path"]),
                write,
                durable=message["durable"],
                digest=digest_of_view,
            )
            answer = ("ok", str(tmp), digest)
        except BaseException as exc:  # every error goes back to the store
            answer = (
                "error",
                type(exc).__name__,
                str(exc),
                getattr(exc, "errno", None),
            )
        del state
        conn.send_bytes(pickle.dumps(answer))


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch  # noqa: F401  (now, while the store's process builds its model)

    conn = Connection(int(argv[0]))
    fds = socket.socket(fileno=int(argv[1]))
    serve(conn, fds, Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
