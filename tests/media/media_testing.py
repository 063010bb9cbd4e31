"""Shared helpers for the media tests: the real media directory and a loopback server."""
from __future__ import annotations

import contextlib
import http.server
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEDIA_DIR = (REPO / ".." / "shared" / "data" / "media").resolve()


def media_path(name: str) -> Path:
    """A file of the shared media set; fails (not skips) with a clear message when absent,
    so a missing data directory is noticed."""
    p = MEDIA_DIR / name
    if not p.is_file():
        pytest.fail(f"test media {name!r} not found: expected the shared media set at "
                    f"{MEDIA_DIR} (../shared/data/media relative to the repo root)")
    return p


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def log_message(self, *args):   # keep pytest output clean
        pass

    def do_GET(self):
        route = self.routes.get(self.path.split("?")[0])
        if route is None:
            self.send_error(404)
            return
        try:
            route(self)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the client hung up on purpose (size limit, timeout)


@contextlib.contextmanager
def loopback_server(routes: dict):
    """An HTTP server on 127.0.0.1 on a free port, serving `routes` {path: fn(handler)}.
    Yields (base_url, seen) where seen lists (path, Host header) of every request."""
    seen: list[tuple[str, str]] = []

    class H(_Handler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Host", "")))
            super().do_GET()

    H.routes = routes
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def send(h, status: int = 200, body: bytes = b"", headers: dict | None = None,
         length: bool = True) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    if length:
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def stall(h, seconds: float) -> None:
    """Headers now, then silence: a server too slow to send its body."""
    h.send_response(200)
    h.send_header("Content-Length", "10")
    h.end_headers()
    h.wfile.flush()
    time.sleep(seconds)
