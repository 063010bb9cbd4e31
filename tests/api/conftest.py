"""A real server process on 127.0.0.1 (a free port), driven by the official openai client."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
        self.log = open(os.path.join(ROOT, f".server-{self.port}.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "server.py"), "--host", "127.0.0.1",
             "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited early:\n{self.log.read()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not become healthy in 180 s")

    def pools(self) -> dict:
        """Pool page counts by state, from /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict = {}
        for line in text.splitlines():
            if line.startswith("mimo_kv_pool_pages{"):
                labels, value = line.split("} ")
                kv = dict(p.split("=") for p in labels[len("mimo_kv_pool_pages{"):].split(","))
                out.setdefault(kv["pool"].strip('"'), {})[kv["state"].strip('"')] = int(float(value))
            elif line.startswith("mimo_engine_steps "):
                out["steps"] = int(float(line.split()[1]))
        return out

    def assert_pools_idle(self, timeout: float = 5.0) -> None:
        deadline = time.time() + timeout
        while True:
            p = self.pools()
            balanced = all(v["free"] + v["evictable"] + v["in_use"] == v["capacity"]
                           for k, v in p.items() if k != "steps")
            idle = all(v["in_use"] == 0 for k, v in p.items() if k != "steps")
            if balanced and idle:
                return
            if time.time() > deadline:
                raise AssertionError(f"pools not idle/balanced: {p}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    # float32: numerics independent of batch composition, so results can be compared with
    # the offline API token for token.
    s = ServerProcess("--dtype", "float32", "--kv-cache-memory", "256MiB", "--api-key", API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def aclient(server):
    """A factory: an AsyncOpenAI client must be made inside the event loop that uses it."""
    from openai import AsyncOpenAI
    return lambda: AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                               timeout=300)
