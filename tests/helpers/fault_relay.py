"""FaultRelay: a loopback TCP relay in front of a worker's port that passes every connection
through, except the first one whose request names `match` after it was armed: on that one
it does the armed fault, once.

    kill   once the request has been passed on (the worker received it, no answer byte has
           come back yet): call `on_fault`, then close both sides (a worker killed
           mid-request)
    cut    once `after` answer bytes came back: call `on_fault` (if any) and close both
           sides (a stream closed mid-payload)
    stall  once `after` answer bytes came back: pass nothing more, hold both sides open
           until `stop()` (a stream that goes silent)

Other connections (health checks, whole requests) are relayed untouched, each closed after
its one request (the relay adds `Connection: close`), so that every request opens a
connection the relay can check."""
from __future__ import annotations

import socket
import threading

from .tcp_relay import close_all, pipe


class FaultRelay:
    def __init__(self, upstream_port: int, match: bytes = b"/v1/internal/prefill"):
        self.upstream_port, self.match = upstream_port, match
        self._armed: tuple[str, int, object] | None = None
        self.fired = threading.Event()
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._lsock = socket.socket()
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(16)
        self.port = self._lsock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, fault: str, after: int = 0, on_fault=None) -> None:
        assert fault in ("kill", "cut", "stall")
        self.fired.clear()
        self._armed = (fault, after, on_fault)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _take(self, first: bytes):
        with self._lock:
            if self._armed is None or self.match not in first:
                return None
            armed, self._armed = self._armed, None
            return armed

    def _serve(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=120)
            first = conn.recv(65536)
            # One request per connection: a kept-alive connection would carry the next
            # request past the check below.
            up.sendall(first.replace(b"\r\n", b"\r\nConnection: close\r\n", 1))
        except OSError:
            conn.close()
            return
        armed = self._take(first)
        threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
        if armed is not None and armed[0] == "kill":
            armed[2]()
            self.fired.set()
            return close_all(conn, up)
        sent = 0
        try:
            while chunk := up.recv(65536):
                if armed is not None and sent + len(chunk) >= armed[1]:
                    conn.sendall(chunk[:armed[1] - sent])
                    fault, _, on_fault = armed
                    if on_fault is not None:
                        on_fault()
                    self.fired.set()
                    if fault == "stall":
                        self._held += [conn, up]
                        return
                    break
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        close_all(conn, up)

    def stop(self) -> None:
        self._lsock.close()
        close_all(*self._held)
        self._held.clear()
