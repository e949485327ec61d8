"""An S3 API server of the tests' own, reached over HTTP exactly as a user reaches MinIO or R2.

``S3Server`` is moto's server mode (``python -m moto.server``) in a process of its own, behind
a gate on 127.0.0.1 and a free port; a job finds it through the standard AWS environment
(``environment``: ``AWS_ENDPOINT_URL``, dummy credentials whose secret is ``SECRET_MARKER``,
so a test can look for it wherever it must never be). It can be stopped and started again on
the same port, its objects kept (a store that went away mid-job and came back): stopping
closes the gate, so connections are refused and those open are cut, as when a server dies,
while moto's process keeps the objects.

moto's server is Flask, and it runs in a process of its own so that Flask is never imported
in the tests' process: vLLM's CPU build, as it starts an engine, looks through every loaded
module's globals, and Flask's context proxies raise on that look outside a request.

``FaultyProxy`` stands between a job and the server and forwards every request as it is,
except for the objects it is told to spoil: ``deny`` answers 403 AccessDenied (S3's own
error document; with ``denial_quotes_request``, its message quotes the request's headers,
signature and session token included, as a verbose server or gateway may), ``cut`` sends
the headers of the whole object and half its body, then closes the connection (an object
cut short mid-read).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape as xml_escape

SECRET_MARKER = "MARKERsecretKEY0123456789abcdefDONOTLEAK"
ACCESS_KEY = "AKIAMARKERTESTKEY0001"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class S3Server:
    """moto's S3 server in a process of its own, reached through a gate that can close."""

    def __init__(self) -> None:
        self.port = free_port()
        self._moto_port = free_port()
        self._moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._moto_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self._moto_port, self._moto)
        self._gate: Gate | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._gate = Gate(self.port, self._moto_port)

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    def close(self) -> None:
        """The gate closed and moto's process ended."""
        self.stop()
        self._moto.terminate()
        self._moto.wait(timeout=30)

    def environment(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS environment that points a job at this server (or at
        ``endpoint``, a proxy in front of it)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_MARKER,
            "AWS_DEFAULT_REGION": REGION,
            # Nothing of the machine's own AWS set-up may take part.
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
            "AWS_CONFIG_FILE": "/nonexistent/config",
            "AWS_EC2_METADATA_DISABLED": "true",
        }


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.1)


class Gate:
    """A TCP relay from ``port`` to ``upstream``, byte for byte, until ``close``: then the
    port refuses connections and every relayed one is cut, as a dead server's would be."""

    def __init__(self, port: int, upstream: int) -> None:
        self._upstream = upstream
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        with self._lock:
            for end in (source, sink):
                if end in self._open:
                    self._open.discard(end)
                    end.close()

    def close(self) -> None:
        # shutdown first: it wakes the accepting thread and stops the listening at once,
        # which a bare close does not while that thread waits in accept.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection"})

DENIED_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


class FaultyProxy:
    """An HTTP proxy to ``upstream`` that spoils the objects named in ``deny`` and ``cut``
    (paths as ``/bucket/key``) and forwards everything else unchanged."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.deny: set[str] = set()
        self.cut: set[str] = set()
        self.denied_message = "Access Denied"
        """What a denial says (a store may quote what it was sent in it)."""
        self.denial_quotes_request = False
        """Whether a denial's message ends with the request's headers, one per line."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy.forward(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        path = urlsplit(handler.path).path
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        if path in self.deny and handler.command in ("GET", "HEAD"):
            message = self.denied_message
            if self.denial_quotes_request:
                message += "".join(f"\n{k}: {v}" for k, v in handler.headers.items())
            body = DENIED_BODY.replace(b"Access Denied", xml_escape(message).encode())
            self._reply(handler, 403, {"Content-Type": "application/xml"}, body)
            return
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP}
        finally:
            upstream.close()
        if path in self.cut and handler.command == "GET" and response.status in (200, 206):
            handler.send_response(response.status)
            for key, value in kept.items():
                if key.lower() != "content-length":
                    handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        self._reply(handler, response.status, kept, data, head=handler.command == "HEAD")

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        data: bytes,
        head: bool = False,
    ) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            if key.lower() != "content-length":
                handler.send_header(key, value)
        declared = next((v for k, v in headers.items() if k.lower() == "content-length"), None)
        handler.send_header("Content-Length", declared if head and declared else str(len(data)))
        handler.end_headers()
        if not head:
            handler.wfile.write(data)


@contextmanager
def faulty_proxy(server: S3Server) -> Iterator[FaultyProxy]:
    proxy = FaultyProxy(server.endpoint)
    try:
        yield proxy
    finally:
        proxy.close()


class Bucket:
    """A bucket of its own on the tests' server, for one test: objects put and read back
    with s3fs, as any user's tool would."""

    def __init__(self, server: S3Server, name: str) -> None:
        import s3fs

        self.server = server
        self.name = name
        self.fs = s3fs.S3FileSystem(
            skip_instance_cache=True,
            use_listings_cache=False,
            key=ACCESS_KEY,
            secret=SECRET_MARKER,
            client_kwargs={"endpoint_url": server.endpoint},
        )
        self.fs.mkdir(name)

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}" if key else f"s3://{self.name}"

    def put(self, key: str, data: bytes) -> str:
        self.fs.pipe_file(f"{self.name}/{key}", data)
        return self.url(key)

    def upload(self, local: Any, prefix: str) -> str:
        """The local folder or file ``local`` under ``prefix``; its URL."""
        from pathlib import Path

        local = Path(local)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for file in files:
            key = prefix if local.is_file() else f"{prefix}/{file.relative_to(local).as_posix()}"
            self.put(key, file.read_bytes())
        return self.url(prefix)

    def get(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(f"{self.name}/{key}"))

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, sorted."""
        found = self.fs.find(f"{self.name}/{prefix}".rstrip("/"))
        return sorted(path.split("/", 1)[1] for path in found)

    def everything(self) -> bytes:
        """Every object of the bucket, one after another: to look for what must not be
        there."""
        return b"".join(self.get(key) for key in self.keys())
