"""CuttingRelay: a loopback TCP relay that passes a connection through to a local port, then,
once `cut_after` bytes came back from upstream, calls `on_cut` and closes both sides: a
transfer killed mid-stream, at a byte the test chooses."""
from __future__ import annotations

import socket
import threading


def close_all(*socks: socket.socket) -> None:
    """Shut down and close each socket, whatever state the other side left it in."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from `src` to `dst` until either side closes."""
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass


class CuttingRelay:
    def __init__(self, upstream_port: int, cut_after: int, on_cut=None):
        self.upstream_port, self.cut_after, self.on_cut = upstream_port, cut_after, on_cut
        self.cut = False
        self._lsock = socket.socket()
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(8)
        self.port = self._lsock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60)
        except OSError:
            conn.close()
            return
        threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
        sent = 0
        try:
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                if sent + len(chunk) >= self.cut_after:
                    conn.sendall(chunk[:self.cut_after - sent])
                    self.cut = True
                    if self.on_cut is not None:
                        self.on_cut()
                    break
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            close_all(conn, up)

    def stop(self) -> None:
        self._lsock.close()
