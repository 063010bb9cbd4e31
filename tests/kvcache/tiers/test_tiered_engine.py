"""The tiers inside the engine (tiny Gemma 3, float32, window 8, page 4): a long prompt,
many windows long, gives exactly the cache-off tokens whether its prefix comes from L1, L2
(L1 too small to keep it), a split hit (full KV in L1, the window in L2), a disk store or
a 3-master Redis Cluster read by a second engine; `cached_tokens` says how much was reused;
a load that fails half way leaks nothing and recomputes. Pools of every tier balance after every scenario."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.kvcache.radix.retention import window_pages
from mimo.kvcache.tiers.page_io import PageIO

PAGE, N = 4, 4200
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
BASE = dict(dtype="float32", page_size=PAGE, progress=False, max_model_len=8192)


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7, max_position_embeddings=8192))


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def prompts():
    return ids(N, 1), ids(N, 2)


@pytest.fixture(scope="module")
def reference(loaded, prompts):
    ref = LLM("tiny", loaded=loaded, kv_cache_memory="64MiB", prefix_cache=False, **BASE)
    return [o.token_ids for o in ref.generate([{"prompt_token_ids": p} for p in prompts],
                                              GREEDY)]


def gen(llm, prompt):
    out = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0]
    assert_balanced(llm)
    return out


def assert_balanced(llm):
    """free + evictable + in_use == capacity in every pool of every tier, nothing in use."""
    eng = llm.engine
    eng.check_integrity()
    pools = [eng.pool.full.allocator, eng.pool.swa.allocator]
    host = getattr(eng.cache, "host", None)
    if host is not None:
        pools += [s.alloc for s in host.stores.values()]
    for a in pools:
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity, a.name
        assert a.num_in_use == 0, f"{a.name}: {a.num_in_use} pages in use at idle"


def test_l1_hit(loaded, prompts, reference):
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", host_kv_cache_memory="8MiB", **BASE)
    a = prompts[0]
    assert gen(llm, a).token_ids == reference[0]
    again = gen(llm, a)
    assert again.token_ids == reference[0]
    # Every prompt token but the last: L1 copies the rows after the whole pages too.
    assert again.cached_tokens == N - 1
    assert llm.engine.cache.l2.hit_tokens == 0


def test_l2_hit_when_l1_cannot_keep_it(loaded, prompts, reference):
    # L1 holds one such request, not two: B evicts A down to L2.
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="2MiB", host_kv_cache_memory="16MiB",
              **BASE)
    a, b = prompts
    assert gen(llm, a).token_ids == reference[0]
    assert gen(llm, b).token_ids == reference[1]
    l2 = llm.engine.cache.l2
    assert l2.pages_written["f"] > 0 and l2.pages_written["s"] > 0
    again = gen(llm, a)
    assert again.token_ids == reference[0]
    assert again.cached_tokens == (N - 1) // PAGE * PAGE
    assert l2.hit_tokens > N // 2


def test_split_hit_full_in_l1_window_in_l2(loaded, prompts, reference):
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="8MiB", host_kv_cache_memory="8MiB", **BASE)
    a = prompts[0]
    assert gen(llm, a).token_ids == reference[0]
    cache = llm.engine.cache
    tree = cache.tree
    # SWA-only eviction of everything unlocked: the full KV stays in L1, the windows go to L2.
    # (Tails, the partial last pages, go first, their full page with them.)
    full_before = llm.engine.pool.full.allocator.num_evictable - tree.stats()["tails"]
    tree.evict(0, llm.engine.pool.swa.allocator.num_evictable)
    assert llm.engine.pool.swa.allocator.num_evictable == 0 == tree.stats()["tails"]
    assert llm.engine.pool.full.allocator.num_evictable == full_before
    assert tree.peek(a[:-1], None, rebuild=0) < N - 100      # L1 alone: no window at the end
    assert_balanced(llm)
    again = gen(llm, a)
    assert again.token_ids == reference[0]
    assert again.cached_tokens == (N - 1) // PAGE * PAGE     # more than a rebuild could give
    assert cache.l2.pages_read["s"] > 0 and cache.l2.pages_read["f"] == 0


def test_disk_tier_in_a_second_engine(loaded, prompts, reference, tmp_path):
    kw = dict(kv_cache_memory="8MiB", kv_storage=f"file:{tmp_path}", **BASE)
    first = LLM("tiny", loaded=loaded, **kw)
    a = prompts[0]
    assert gen(first, a).token_ids == reference[0]
    assert first.engine.flush_tiers()
    first.engine.close()
    second = LLM("tiny", loaded=loaded, **kw)          # a restart: empty L1, same directory
    out = gen(second, a)
    assert out.token_ids == reference[0]
    st = second.engine.cache.storage
    assert out.cached_tokens == (N - 1) // PAGE * PAGE, (st.stats, st.storage.stats)
    l3 = second.engine.cache.l3
    assert l3.hit_tokens == out.cached_tokens
    # The minimum: full KV for the hit, SWA only for the window before its end.
    io = second.engine.cache.io
    assert l3.pages_read["f"] == out.cached_tokens // PAGE
    assert l3.pages_read["s"] == len(window_pages(out.cached_tokens, 8, PAGE))
    assert l3.bytes_read == (l3.pages_read["f"] * io["f"].row_bytes
                             + l3.pages_read["s"] * io["s"].row_bytes)
    second.engine.close()


def test_a_load_that_fails_half_way_leaks_nothing(loaded, prompts, reference, monkeypatch):
    llm = LLM("tiny", loaded=loaded, kv_cache_memory="2MiB", host_kv_cache_memory="16MiB",
              **BASE)
    a, b = prompts
    gen(llm, a)
    gen(llm, b)                         # A now lives in L2
    calls = {"n": 0}
    real = PageIO.scatter

    def failing(self, pages, rows):
        calls["n"] += 1
        if calls["n"] == 2:             # the full pages went in; the SWA window fails
            raise RuntimeError("injected copy failure")
        return real(self, pages, rows)

    monkeypatch.setattr(PageIO, "scatter", failing)
    out = gen(llm, a)                   # recomputes (what L1 still had may still hit)
    assert calls["n"] >= 2
    assert out.token_ids == reference[0]
    assert llm.engine.cache.load_errors == 1
    monkeypatch.setattr(PageIO, "scatter", real)
    again = gen(llm, a)
    assert again.token_ids == reference[0]
    # The recompute left A in L1, its partial last page included: an L1 hit of all but the
    # last prompt token.
    assert again.cached_tokens == N - 1


def test_redis_cluster_tier_in_a_second_engine(loaded, prompts, reference):
    from helpers.redis_servers import RedisCluster3
    with RedisCluster3() as cluster:
        kw = dict(kv_cache_memory="8MiB", kv_storage=cluster.url, **BASE)
        first = LLM("tiny", loaded=loaded, **kw)
        b = prompts[1]
        assert gen(first, b).token_ids == reference[1]
        assert first.engine.flush_tiers()
        second = LLM("tiny", loaded=loaded, **kw)
        out = gen(second, b)
        assert out.token_ids == reference[1]
        assert out.cached_tokens == second.engine.cache.l3.hit_tokens == (N - 1) // PAGE * PAGE
        for x in (first, second):
            x.engine.close()
