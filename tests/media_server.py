"""A local HTTP server of media for the tests of fetching URLs (``--allow-urls``): it serves
named payloads, a 404 for any other path, a body that trickles (``/slow``) and one that
answers once it has been asked two things at once (``/late/...``), and counts what it was
asked."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

TRICKLE_SECONDS = 20.0
"""How long ``/slow`` trickles its body, a byte each 0.1 s: far longer than a fetch's
time limit (1 s) takes to end it, however slow a loaded machine is."""
LATE_SECONDS = 10.0
"""How long a ``/late/NAME`` path waits, at most, for the server to be answering another
request too, before it serves ``/NAME``: requests sent together meet at once; requests sent
one after another wait this long and leave ``most_at_once`` at 1."""


class MediaServer(http.server.ThreadingHTTPServer):
    payloads: Mapping[str, bytes]
    hits: Counter[str]
    """Requests received, by path."""
    in_flight: int
    most_at_once: int
    """The most requests being answered at one time."""
    lock: threading.Lock
    overlap: threading.Condition
    """Notified, under ``lock``, as a request begins."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: MediaServer

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.hits[self.path] += 1
            self.server.in_flight += 1
            self.server.most_at_once = max(self.server.most_at_once, self.server.in_flight)
            self.server.overlap.notify_all()
        try:
            self._answer()
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self) -> None:
        path = self.path
        if path == "/slow":
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(int(TRICKLE_SECONDS * 10)):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up, as it should
            return
        if path.startswith("/late/"):
            with self.server.overlap:
                together = lambda: self.server.most_at_once >= 2  # noqa: E731
                self.server.overlap.wait_for(together, timeout=LATE_SECONDS)
            path = path.removeprefix("/late")
        body = self.server.payloads.get(path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read the results, not the access log."""


@contextmanager
def serving(payloads: Mapping[str, bytes]) -> Iterator[MediaServer]:
    """A ``MediaServer`` on 127.0.0.1 (a free port) serving ``payloads`` by path, on a
    thread, for the duration of the ``with``."""
    httpd = MediaServer(("127.0.0.1", 0), _Handler)
    httpd.payloads = payloads
    httpd.hits = Counter()
    httpd.in_flight = httpd.most_at_once = 0
    httpd.lock = threading.Lock()
    httpd.overlap = threading.Condition(httpd.lock)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
