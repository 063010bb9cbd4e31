"""Shared helpers for the media tests: the real media directory and a loopback server."""
from __future__ import annotations

import contextlib
import http.server
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]   # tests/helpers/media.py
MEDIA_DIR = REPO / "data" / "media"


def media_path(name: str) -> Path:
    """A file of the repository's media set (data/media); fails (not skips) with a clear message when absent,
    so a missing data directory is noticed."""
    p = MEDIA_DIR / name
    if not p.is_file():
        pytest.fail(f"test media {name!r} not found in {MEDIA_DIR}")
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


def self_signed_cert(directory: Path, hostname: str) -> tuple[Path, Path]:
    """(cert, key) for `hostname`, made with the openssl CLI (skips when absent)."""
    import shutil
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    cert, key = directory / f"{hostname}.crt", directory / f"{hostname}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={hostname}", "-addext", f"subjectAltName=DNS:{hostname}",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def loopback_server(routes: dict, tls: tuple[Path, Path] | None = None):
    """An HTTP server on 127.0.0.1 on a free port, serving `routes` {path: fn(handler)};
    HTTPS when `tls` = (cert, key). Yields (base_url, seen) where seen lists (path, Host
    header) of every request."""
    seen: list[tuple[str, str]] = []

    class H(_Handler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Host", "")))
            super().do_GET()

    H.routes = routes
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    scheme = "http"
    if tls is not None:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        scheme = "https"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"{scheme}://127.0.0.1:{srv.server_address[1]}", seen
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
