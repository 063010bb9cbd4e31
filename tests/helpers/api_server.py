"""The API tests' server process and constants, importable by test modules (a conftest is not:
pytest keeps only the last conftest it loaded under the name `conftest`)."""
from __future__ import annotations

import os
import time

import httpx

from mimo.bench.server_process import ServerProcess as BaseServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API_KEY = "test-key"
KEY_HEADER = {"Authorization": f"Bearer {API_KEY}"}   # /metrics needs it too


class ServerProcess(BaseServerProcess):
    """`server.py` with these flags on a free 127.0.0.1 port (see mimo.bench.server_process),
    plus the pool checks the API tests make after their scenarios."""
    def __init__(self, *args: str):
        super().__init__(list(args), start_timeout=180)

    def pools(self) -> dict:
        """Pool page counts by state, from /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10, headers=KEY_HEADER).text
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


MAX_MEDIA_BYTES = 1_500_000      # above every test file, below the "too large" download


def vlm_server_process(vlm_dir, media_dir, *extra):
    return ServerProcess("--model", str(vlm_dir), "--dtype", "float32", "--kv-cache-memory",
                         "64MiB", "--allowed-media-dir", str(media_dir), "--max-media-bytes",
                         str(MAX_MEDIA_BYTES), *extra)
