"""What the disaggregation process tests share: a tiny MiMo-V2-Flash written to disk, the
workers' flags, and the pool checks on a running worker's URL."""
from __future__ import annotations

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
