"""The writer process: serializes, writes, hashes and fsyncs a payload.

Started by :class:`~dp_ckpt_plugin.background.process.WriterProcess` as
``python -m dp_ckpt_plugin.background.child <fd of messages> <fd of buffers> <D> <format>``.
It maps the shared snapshot buffers it is sent (once each), rebuilds the
payload around them and writes it with the store's format (torch or HDF5,
each message names it) through a
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
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds
from pathlib import Path


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, buffers: dict) -> None:
        super().__init__(io.BytesIO(data))
        self.buffers = buffers

    def persistent_load(self, pid):
        from .shm import view_of

        _, ident, dtype, shape, kind, grad = pid
        mapped = self.buffers[ident]
        if kind == "ndarray":
            import numpy as np

            return view_of(mapped, np.dtype(dtype), shape)
        import torch

        tensor = view_of(mapped, getattr(torch, dtype), shape)
        if kind == "parameter":
            return torch.nn.Parameter(tensor, requires_grad=grad)
        return tensor


def serve(conn: Connection, fds: socket.socket, root: Path) -> None:
    """Answer write requests until told to stop or the store is gone."""
    from ..checkpoint.digests import digest_of_view
    from ..formats import hdf5 as hdf5_format
    from ..formats import torch as torch_format
    from ..storage.local import LocalStorage

    formats = {torch_format.NAME: torch_format, hdf5_format.NAME: hdf5_format}

    storage = LocalStorage(root)
    buffers: dict[int, mmap.mmap] = {}
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if message["op"] == "exit":
            return
        new = message["new"]
        if new:
            received = recvfds(fds, len(new))
            for ident, fd in zip(new, received, strict=True):
                buffers[ident] = mmap.mmap(fd, 0)
                os.close(fd)
        state = None
        try:
            state = _Unpickler(message["payload"], buffers).load()
            name = message["format"]
            write = partial(formats[name].on_save_step, name, message["step"], state)
            tmp, digest = storage.write_payload(
                Path(message["path"]),
                write,
                durable=message["durable"],
                digest=digest_of_view,
            )
            answer = ("ok", str(tmp), digest)
        except BaseException as exc:  # every error goes back to the store
            code = getattr(exc, "errno", None)
            answer = ("error", type(exc).__name__, str(exc), code)
        del state
        conn.send_bytes(pickle.dumps(answer))


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the serializer now, while the store's process builds its model
    if argv[3:] == ["hdf5"]:
        import h5py  # noqa: F401
    else:
        import torch  # noqa: F401

    conn = Connection(int(argv[0]))
    fds = socket.socket(fileno=int(argv[1]))
    serve(conn, fds, Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
