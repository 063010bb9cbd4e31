"""A store's I/O loop running late, as on a loaded machine (the GIL, the cores)."""
from __future__ import annotations

import asyncio
import time


def stall_after_first_client(monkeypatch, seconds: float) -> None:
    """The store's I/O loop stalls `seconds` right after the first node client is made,
    while its connection opens: what a loaded machine (the GIL, the cores) does to it."""
    from mimo.kvcache.tiers import redis_store
    init = redis_store.RedisNode.__init__
    left = [1]

    def stalled(self, name, make, backoff):
        def make_then_stall():
            client = make()
            if left[0]:
                left[0] -= 1
                asyncio.get_running_loop().call_soon(time.sleep, seconds)
            return client
        init(self, name, make_then_stall, backoff)
    monkeypatch.setattr(redis_store.RedisNode, "__init__", stalled)

