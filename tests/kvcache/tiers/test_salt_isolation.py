"""cache_salt at every KV tier of the engine (tiny Gemma 3, float32, window 8, page 4): a
prompt cached under one salt is read back under another salt, and without one, and gets 0
cached tokens from L1 (the radix tree), the host tier (L2), a disk store, a Redis server and
a Redis Cluster (each read by a second engine, as after a restart); under the same salt it
hits in full. Every answer equals the cache-off one, and the pools balance."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.kvcache.radix.namespace import CacheScope

PAGE, N = 4, 256
HIT = (N - 1) // PAGE * PAGE      # whole pages: what the tiers below L1 hold
L1_HIT = N - 1                    # L1 also copies the next page's first rows (radix/tails.py)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BASE = dict(dtype="float32", page_size=PAGE, progress=False, max_model_len=1024)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7, max_position_embeddings=1024))


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(3, 512, (N,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.fixture(scope="module")
def reference(loaded, prompt):
    ref = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", prefix_cache=False, **BASE)
    return ref.generate({"prompt_token_ids": prompt}, GREEDY)[0].token_ids


def run(llm, prompt, salt, reference):
    """One request under `salt`: its cached tokens (its answer checked, pools checked)."""
    eng = llm.engine
    seq = eng.add_request(prompt, GREEDY, scope=CacheScope(salt=salt))
    while seq.finish_reason is None:
        eng.step()
    assert seq.output_ids == reference
    eng.check_integrity()
    pools = [eng.pool.full.allocator, eng.pool.swa.allocator]
    host = getattr(eng.cache, "host", None)
    if host is not None:
        pools += [s.alloc for s in host.stores.values()]
    for a in pools:
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity, a.name
        assert a.num_in_use == 0, a.name
    return seq.cached_tokens


def test_l1_reads_across_salts_miss(loaded, prompt, reference):
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", **BASE)
    assert run(llm, prompt, "alice", reference) == 0
    assert run(llm, prompt, "bob", reference) == 0
    assert run(llm, prompt, None, reference) == 0
    assert run(llm, prompt, "alice", reference) == L1_HIT
    assert run(llm, prompt, "bob", reference) == L1_HIT
    assert run(llm, prompt, None, reference) == L1_HIT
    assert run(llm, prompt, "alice ", reference) == 0        # any other string is another salt


def test_host_tier_reads_across_salts_miss(loaded, prompt, reference):
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", host_kv_cache_memory="8MiB",
              **BASE)
    assert run(llm, prompt, "alice", reference) == 0
    pool = llm.engine.pool
    llm.engine.cache.tree.evict(pool.full.allocator.num_evictable,
                                pool.swa.allocator.num_evictable)   # all of L1 down to L2
    l2 = llm.engine.cache.l2
    assert l2.pages_written["f"] >= HIT // PAGE
    for salt in ("bob", None):
        assert run(llm, prompt, salt, reference) == 0
        assert l2.hit_tokens == 0
        pool = llm.engine.pool      # drop the copy just made in L1: only L2 could serve
        llm.engine.cache.tree.evict(pool.full.allocator.num_evictable,
                                    pool.swa.allocator.num_evictable)
    assert run(llm, prompt, "alice", reference) == HIT
    assert l2.hit_tokens >= HIT - PAGE


def _write_alice(loaded, kw, prompt, reference):
    """The prompt's pages into the store under "alice", from a fresh engine. A write the
    store refuses is a dropped write (the tier's rule: a later miss, never an error), as a
    batch on a loaded machine can be; this case is about reads, so a refused write is made
    again, at most 3 times, and what each try saw is in the message if none lands."""
    tries = []
    for _ in range(3):
        first = LLM("tiny", loaded=loaded, **kw)
        try:
            got = run(first, prompt, "alice", reference)
            assert got == 0 or tries, got        # nothing stored before the first try
            assert first.engine.flush_tiers()
            stats = first.engine.cache.storage.stats
            tries.append((stats.pages, stats.failed, stats.dropped,
                          {k: v for k, v in first.engine.cache.storage.storage.stats.errors.items()
                           if v}))
            if stats.failed == stats.dropped == 0:
                return
        finally:
            first.engine.close()
    raise AssertionError(f"the store refused the writes 3 times: {tries}")


def _storage_case(loaded, prompt, reference, url):
    kw = dict(kv_cache_memory="8MiB", kv_storage=url, **BASE)
    _write_alice(loaded, kw, prompt, reference)
    for salt in ("bob", None, "alice"):
        # A fresh engine each time (an empty L1: the store is the only place to hit).
        other = LLM("tiny", loaded=loaded, **kw)
        try:
            got = run(other, prompt, salt, reference)
            l3 = other.engine.cache.l3.hit_tokens
            st = other.engine.cache.storage.stats
            assert (got, l3) == ((HIT, HIT) if salt == "alice" else (0, 0)), \
                (salt, st.fetches, st.fetch_timeouts, st.fetch_errors)
            assert other.engine.flush_tiers()
        finally:
            other.engine.close()


def test_disk_tier_reads_across_salts_miss(loaded, prompt, reference, tmp_path):
    _storage_case(loaded, prompt, reference, f"file:{tmp_path}")


def test_redis_tier_reads_across_salts_miss(loaded, prompt, reference):
    from helpers.redis_servers import RedisServer
    server = RedisServer()
    try:
        _storage_case(loaded, prompt, reference, server.url)
    finally:
        server.stop()


def test_redis_cluster_tier_reads_across_salts_miss(loaded, prompt, reference):
    from helpers.redis_servers import RedisCluster3
    with RedisCluster3() as cluster:
        _storage_case(loaded, prompt, reference, cluster.url)
