"""A real `server.py` process on a free 127.0.0.1 port, for the benchmarks that drive one
(serve, soak) and the tests of programs that serve. It dies with its parent (Linux:
PR_SET_PDEATHSIG), so a killed run leaves no server behind; `stop()` ends it otherwise."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when this process dies (even by SIGKILL)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:   # noqa: BLE001 - not Linux: stop() still ends it
        pass


class ServerProcess:
    def __init__(self, flags: list[str], start_timeout: float = 300.0,
                 script: str | Path = ROOT / "server.py"):
        """Start `script --host 127.0.0.1 --port <free> *flags` (default: server.py; any
        program taking those two flags, e.g. examples/custom_engine.py) and wait until
        /health answers; raises RuntimeError (with the server's log tail) if it exits or
        does not answer within `start_timeout` seconds."""
        import httpx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, str(script), "--host", "127.0.0.1",
               "--port", str(self.port), *flags]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.pid = self.proc.pid
        try:
            until = time.time() + start_timeout
            while time.time() < until:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log_tail()}")
                try:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            raise RuntimeError(f"server did not answer /health in {start_timeout:.0f} s")
        except BaseException:
            self.stop()
            raise

    def log_tail(self, n: int = 3000) -> str:
        try:
            self.log.seek(0)
            return self.log.read()[-n:]
        except (ValueError, OSError):
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str) -> float:
        """An unlabelled metric's value from /metrics (NaN if absent)."""
        import httpx
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return float("nan")

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 15 s) and close its log; idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.log.close()
