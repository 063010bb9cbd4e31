"""A real server process on 127.0.0.1 (a free port), driven by the official openai client."""
from __future__ import annotations

import os
import time

import httpx
import pytest

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


@pytest.fixture(scope="session")
def spec_server():
    """The same server with n-gram speculative decoding."""
    s = ServerProcess("--dtype", "float32", "--kv-cache-memory", "256MiB", "--api-key", API_KEY,
                      "--speculative", "ngram", "--num-draft-tokens", "4")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def spec_client(spec_server):
    from openai import OpenAI
    return OpenAI(base_url=spec_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def aclient(server):
    """A factory: an AsyncOpenAI client must be made inside the event loop that uses it."""
    from openai import AsyncOpenAI
    return lambda: AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                               timeout=300)


# ---- a vision-language model (tiny Qwen2.5-VL) behind the real server ----------------------
MAX_MEDIA_BYTES = 1_500_000      # above every test file, below the "too large" download


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory):
    from mimo.models.tiny import qwen2_5_vl
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    qwen2_5_vl.write(d, seed=3)
    return d


@pytest.fixture(scope="session")
def media_dir():
    from helpers.media import MEDIA_DIR, media_path
    for name in ("astronaut.png", "coffee.png", "rocket.jpg", "nasa_13013.mp4"):
        media_path(name)          # fails, naming the missing file, when the set is absent
    return MEDIA_DIR


def _vlm_server(vlm_dir, media_dir, *extra):
    return ServerProcess("--model", str(vlm_dir), "--dtype", "float32", "--kv-cache-memory",
                         "64MiB", "--allowed-media-dir", str(media_dir), "--max-media-bytes",
                         str(MAX_MEDIA_BYTES), *extra)


@pytest.fixture(scope="session")
def vlm_server(vlm_dir, media_dir):
    """May fetch from loopback (the test HTTP server): --allow-private-media-urls."""
    s = _vlm_server(vlm_dir, media_dir, "--allow-private-media-urls")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def vlm_strict_server(vlm_dir, media_dir):
    """The default policy: no private addresses."""
    s = _vlm_server(vlm_dir, media_dir)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def vlm_client(vlm_server):
    from openai import OpenAI
    return OpenAI(base_url=vlm_server.url + "/v1", api_key="none", max_retries=0, timeout=300)
