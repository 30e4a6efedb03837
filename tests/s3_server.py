"""A real S3 endpoint for the tests: moto's standalone server on 127.0.0.1.

:class:`S3Server` runs moto's ``ThreadedMotoServer`` on a free port of the
loopback address, for the whole session, and can be stopped and started
again on the same port in the middle of a test (a server killed during an
upload); moto keeps its buckets in the process, so what was stored is still
there after a restart. :class:`FaultProxy` stands between a storage and the
server and answers chosen requests itself (a 503, a 412, a 409) or holds them
unanswered (a timeout): moto cannot be told to fail.

:data:`MISSING` says why these cannot run (moto, boto3 or obstore not
installed), or is ``None``. The fixtures built on this are in ``conftest.py``:
``s3_server`` (the session's server), ``s3_env`` (the AWS variables of a test:
the endpoint, fake keys with a planted secret, the region, no instance
metadata, no ``~/.aws``), ``s3_bucket`` (a fresh bucket and prefix, emptied
and removed afterwards) and ``fault_proxy``.
"""

from __future__ import annotations

import http.client
import importlib.util
import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from helpers import free_port

#: Why the S3 tests cannot run here, or ``None``.
MISSING = next(
    (
        f"the S3 tests need {name} (pip install -e '.[test,s3]')"
        for name, module in (
            ("moto[server]", "moto"),
            ("moto[server]", "flask"),
            ("boto3", "boto3"),
            ("obstore", "obstore"),
        )
        if importlib.util.find_spec(module) is None
    ),
    None,
)
#: The access key id the tests' storages sign with.
ACCESS_KEY_ID = "AKIATESTTESTTEST"
#: A secret planted in the environment that no message may ever hold.
SECRET_ACCESS_KEY = "planted-Secret/Key+" + "9" * 21
REGION = "us-east-1"


def _wait_until(test, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        if time.monotonic() > deadline:
            raise TimeoutError("the test server did not come up")
        time.sleep(0.02)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class S3Server:
    """moto's S3 server on ``127.0.0.1:<port>``, stoppable and restartable."""

    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._client = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Start serving on the port (the same one after a :meth:`stop`)."""
        from moto.server import ThreadedMotoServer

        if self._server is not None:
            return
        for attempt in range(50):
            server = ThreadedMotoServer("127.0.0.1", self.port, verbose=False)
            try:
                server.start()
            except OSError:  # the port is still held by the last run's socket
                if attempt == 49:
                    raise
                time.sleep(0.1)
                continue
            self._server = server
            break
        _wait_until(lambda: _accepts(self.port))
        self.client()

    def stop(self) -> None:
        """Stop serving and close the port: connections are refused."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        # ThreadedMotoServer.stop leaves the listening socket open (a
        # connection would hang, not be refused); close it
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()

    def client(self):
        """A boto3 S3 client on the server (for setting up and looking).

        Made once, before any test changes the AWS variables it would read.
        """
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        )

    def make_bucket(self) -> str:
        """Create a bucket with a fresh name; return the name."""
        name = f"test-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name

    def remove_bucket(self, name: str) -> None:
        """Empty a bucket (objects and incomplete uploads) and remove it."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=name, Key=item["Key"])
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(
                Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        client.delete_bucket(Bucket=name)


@dataclass
class S3Bucket:
    """A fresh bucket of a test, and a URL under it."""

    server: S3Server
    name: str
    prefix: str = "run"

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}"

    def keys(self) -> list[str]:
        """Every key in the bucket, as boto3 lists them."""
        pages = self.server.client().get_paginator("list_objects_v2")
        return sorted(
            item["Key"]
            for page in pages.paginate(Bucket=self.name)
            for item in page.get("Contents", [])
        )

    def uploads(self) -> list[dict]:
        """The incomplete multipart uploads in the bucket, as boto3 lists them."""
        found = self.server.client().list_multipart_uploads(Bucket=self.name)
        return found.get("Uploads", [])


@dataclass
class _Rule:
    method: str | None
    status: int
    times: int
    stall: float = 0.0


_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error>"
)
_CODES = {
    409: ("ConditionalRequestConflict", "A conflicting conditional operation"),
    412: ("PreconditionFailed", "At least one of the preconditions failed"),
    500: ("InternalError", "We encountered an internal error"),
    503: ("SlowDown", "Please reduce your request rate"),
}


class FaultProxy:
    """An HTTP proxy in front of the S3 server that fails chosen requests.

    :meth:`fail` makes the next ``times`` requests (of one method) answer a
    status of the proxy's own; :meth:`stall` holds them unanswered for a
    while. ``requests`` counts what reached the proxy, by method.
    """

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.rules: list[_Rule] = []
        self.requests: dict[str, int] = {}
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def fail(self, status: int, *, times: int = 1, method: str | None = None) -> None:
        """Answer ``status`` to the next ``times`` requests (of ``method``)."""
        with self.lock:
            self.rules.append(_Rule(method, status, times))

    def stall(self, seconds: float, *, times: int = 1, method: str | None = None):
        """Hold the next ``times`` requests (of ``method``) ``seconds`` unanswered."""
        with self.lock:
            self.rules.append(_Rule(method, 0, times, seconds))

    def _rule(self, method: str) -> _Rule | None:
        with self.lock:
            self.requests[method] = self.requests.get(method, 0) + 1
            for rule in self.rules:
                if rule.times > 0 and rule.method in (None, method):
                    rule.times -= 1
                    return rule
        return None

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        rule = self._rule(handler.command)
        if rule is not None and rule.stall:
            time.sleep(rule.stall)
            handler.close_connection = True
            return
        if rule is not None:
            code, message = _CODES.get(rule.status, ("Injected", "injected"))
            data = _ERROR_BODY.format(code=code, message=message).encode()
            handler.send_response(rule.status)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(data)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items()}
            conn.request(handler.command, handler.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        except OSError:
            handler.close_connection = True
            return
        finally:
            conn.close()
        handler.send_response(answer.status)
        for name, value in answer.getheaders():
            skip = ("connection", "transfer-encoding")
            if handler.command != "HEAD":
                skip += ("content-length",)
            if name.lower() not in skip:
                handler.send_header(name, value)
        if handler.command != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The body of a request, sized or chunked."""
    if "chunked" in (handler.headers.get("Transfer-Encoding") or "").lower():
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline().strip():
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""
