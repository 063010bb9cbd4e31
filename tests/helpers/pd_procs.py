"""What the disaggregation process tests share: a tiny MiMo-V2-Flash written to disk, the
workers' flags, and the pool checks on a running worker's URL."""
from __future__ import annotations

import time

import httpx

from helpers.api_server import ServerProcess


def write_tiny_mimo(tmp_path_factory, name: str) -> str:
    """Tiny MiMo-V2-Flash (seed 5) in a fresh folder `name`: the model every PD test serves."""
    from mimo.models.tiny import mimo_v2_flash
    d = tmp_path_factory.mktemp(name)
    mimo_v2_flash.write(d, seed=5)
    return str(d)


def pd_flags(model: str, *extra: str) -> list[str]:
    """float32, no quantization (token for token with a single worker), one thread each."""
    return ["--model", model, "--dtype", "float32", "--quantize", "none", "--kv-cache-memory",
            "64MiB", "--page-size", "16", "--threads", "1", "--metrics-public", *extra]


class PoolsAt(ServerProcess):
    """The API tests' pool checks on a running worker's URL (no process of its own)."""
    def __init__(self, url: str):
        self.url = url


def assert_idle(*workers) -> None:
    for w in workers:
        PoolsAt(w.url).assert_pools_idle(timeout=10)


def wait_paired(router: str, model: str, prefill: str, decode: str, prompt) -> None:
    """Until the router pairs `prefill` with `decode` for `prompt` (it saw both healthy)."""
    body = {"kind": "completion", "body": {"model": model, "prompt": prompt}}
    until = time.time() + 60
    while time.time() < until:
        d = httpx.post(router + "/router/decide", json=body, timeout=10).json()
        if (d.get("worker"), d.get("prefill")) == (decode, prefill):
            return
        time.sleep(0.2)
    raise AssertionError(f"the router did not pair {prefill} with {decode}: {d}")
