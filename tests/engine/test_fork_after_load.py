"""A prompt that forks from the one sent just before it reuses the shared part after a load,
in every dtype. The server's pools are sized from a byte budget, so float32 has half the
SWA pages of bfloat16 and the same load fills them. The replay is bench peers' workload
(16 concurrent streams, a 3,000-token prompt twice, then a 3,000-token prompt and one
sharing its first 2,000 tokens) through the scheduler and the prefix cache with the real
model's KV shapes (gemma-3-270m: window 512, pages of 16, prefill chunks of 512, a 1 GiB
budget: the server's defaults) and no model.

The fork hits through the windows the first prompt's prefill chunks left at each chunk end
(chunks of 512 = W tile the prompt). Before the fix, the first prompt's own later chunks
evicted its earlier windows ahead of the load's idle ones (they were demoted as soon as the
next chunk extended them), and the fork got 0 cached tokens in float32."""
import random

import pytest
from helpers.sched_harness import Harness

from mimo.config import CacheConfig
from mimo.kvcache.pool.layout import plan_pages, shape_layout


def _harness(dtype: str) -> Harness:
    layout = shape_layout("gemma-3-270m", dtype)
    full, swa = plan_pages(layout, CacheConfig(kv_cache_memory=2**30), 8192, chunk=512)
    return Harness(page=16, full_pages=full, swa_pages=swa, chunk=512, layout=layout,
                   policy="compute-aware")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_fork_of_the_prompt_just_sent_hits_after_a_load(dtype):
    h = _harness(dtype)
    rng = random.Random(0)

    def words(n):
        return [rng.randrange(10, 5000) for _ in range(n)]

    def prompt(n):
        return [2, 5] + words(n - 2)        # BOS "The" ...

    def send(*prompts, max_tokens):
        seqs = [h.add(p, max_tokens=max_tokens) for p in prompts]
        h.run()
        return seqs

    send(prompt(16), max_tokens=4)                                  # warm-up
    for _ in range(3):
        send(prompt(256), max_tokens=128)                           # single streams
    send(*[prompt(256) for _ in range(16)], max_tokens=128)        # 16 concurrent
    long = prompt(3000)
    send(long, max_tokens=2)
    again, = send(long, max_tokens=2)
    # Every prompt token but the last: 2,992 in whole pages (the prompt-end checkpoint), 7
    # from the partial page the first run left (its tail, radix/tails.py).
    assert again.cached_tokens == 2999
    shared = prompt(2000)
    first, = send(shared + words(1000), max_tokens=2)
    fork, = send(shared + words(1000), max_tokens=2)
    # The SWA pool is short in float32: the load's windows had to go (not the fork's).
    if dtype == "float32":
        assert h.cache.counters()["evicted_swa"] + h.cache.counters()["tombstoned_swa"] > 0
    assert fork.cached_tokens == 2000
    h.check_idle()
