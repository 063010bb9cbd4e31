"""Faults below L1 are misses, never errors and never wrong tokens (tiny Gemma 3, float32,
real redis-server processes and a real 3-master Redis Cluster on loopback ports): Redis
killed mid-run and back, corrupt and truncated disk entries, a full disk cap, another
model's KV in the same Redis, a dead cluster master, and keep-alive under Redis's LRU."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from helpers.redis_servers import RedisCluster3, RedisServer
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.kvcache.tiers.hit_plan import best_hit

PAGE, N, W = 4, 1200, 8
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
# The faults here are refused connections and bad bytes, which fail at once; the deadline only
# has to be long enough that a healthy lookup on a loaded 2-core CI machine never runs past it
# (at 1 s a full hit once read as a miss in CI, most likely a lookup past its deadline; the
# hit assertions name the store's errors).
BASE = dict(dtype="float32", page_size=PAGE, progress=False, kv_cache_memory="8MiB",
            kv_storage_timeout=10.0)
FULL_HIT = (N - 1) // PAGE * PAGE


@pytest.fixture(scope="module")
def loaded():
    return loaded_from_hf(tiny_gemma3_hf(seed=7))


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def ref(loaded):
    llm = LLM("tiny", loaded=loaded, prefix_cache=False, **BASE)
    memo: dict = {}

    def tokens(prompt):
        key = tuple(prompt)
        if key not in memo:
            memo[key] = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0].token_ids
        return memo[key]
    return tokens


def gen(llm, prompt):
    out = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0]
    llm.engine.check_integrity()
    return out


def engine(loaded, url, **kw):
    return LLM("tiny", loaded=loaded, kv_storage=url, **{**BASE, **kw})


def errors(llm) -> dict:
    return dict(llm.engine.cache.storage.storage.stats.errors)


def written(llm, prompt):
    out = gen(llm, prompt)
    assert llm.engine.flush_tiers()
    return out


def test_redis_killed_mid_run_then_back(loaded, ref):
    a, b, c = ids(N, 1), ids(N, 2), ids(N, 3)
    with RedisServer() as redis:
        llm = engine(loaded, redis.url)
        assert written(llm, a).token_ids == ref(a)
        redis.kill()
        out = gen(llm, b)                       # lookup and writes fail: recompute
        assert out.token_ids == ref(b) and out.cached_tokens == 0
        llm.engine.flush_tiers()
        assert errors(llm)["unavailable"] > 0
        fresh = engine(loaded, redis.url)       # Redis still down: a miss, not an error
        out = gen(fresh, a)
        assert out.token_ids == ref(a) and out.cached_tokens == 0
        redis.restart()                         # empty (no persistence), same port
        time.sleep(1.0)                         # past the store's retry backoff
        assert written(llm, c).token_ids == ref(c)   # the same store object reconnects
        again = engine(loaded, redis.url)
        out = gen(again, c)
        assert out.token_ids == ref(c) and out.cached_tokens == FULL_HIT
        for x in (llm, fresh, again):
            x.engine.close()


def test_corrupt_and_truncated_disk_entries_are_misses_and_deleted(loaded, ref, tmp_path):
    a = ids(N, 4)
    # 512-token chunks: the store gets a window where each chunk ends (page 128 among them).
    first = engine(loaded, f"file:{tmp_path}", max_num_batched_tokens=512)
    written(first, a)
    first.engine.close()
    # Flip a byte in the middle of one page's full-KV entry and truncate a later one's.
    from mimo.kvcache.tiers.file_store import FileStore
    keys = first.engine.cache.keys
    page_key = keys.page_keys(a[:FULL_HIT], None)
    store = FileStore(str(tmp_path))
    bad, short = (Path(store.path_of(keys.name("f", page_key[i]))) for i in (150, 200))
    blob = bytearray(bad.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    bad.write_bytes(bytes(blob))
    short.write_bytes(short.read_bytes()[:100])
    # The longest window-safe hit before page 150 among the windows the store holds.
    swa_ok = [Path(store.path_of(keys.name("s", k))).exists() for k in page_key]
    expect = best_hit([i not in (150, 200) for i in range(len(page_key))], swa_ok, W, PAGE)
    assert 0 < expect < 150
    second = engine(loaded, f"file:{tmp_path}")
    out = gen(second, a)
    assert out.token_ids == ref(a)
    assert out.cached_tokens == expect * PAGE   # the hit stops before the damaged page
    assert errors(second)["corrupt"] >= 1
    assert second.engine.cache.storage.storage.stats.deleted_corrupt == 2
    # The recomputed pages were written again: the store healed, a third engine hits all.
    assert second.engine.flush_tiers()
    third = engine(loaded, f"file:{tmp_path}")
    out = gen(third, a)
    assert out.token_ids == ref(a) and out.cached_tokens == FULL_HIT
    third.engine.close()
    second.engine.close()


def test_disk_cap_drops_writes_without_errors(loaded, ref, tmp_path):
    a = ids(N, 5)
    llm = engine(loaded, f"file:{tmp_path}", kv_disk_cap="64KiB")
    out = written(llm, a)
    assert out.token_ids == ref(a)
    st = llm.engine.cache.storage
    assert st.stats.failed > 0                  # pages the store refused (counted)
    assert errors(llm)["full"] > 0
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert size <= 64 * 1024
    out = gen(llm, ids(N, 6))                   # and it keeps serving
    assert out.token_ids == ref(ids(N, 6))
    llm.engine.close()


def test_another_models_kv_in_the_same_redis_never_hits(loaded, tmp_path):
    other = loaded_from_hf(tiny_gemma3_hf(seed=8))
    a = ids(N, 7)
    with RedisServer() as redis:
        mine = engine(loaded, redis.url)
        written(mine, a)
        theirs = engine(other, redis.url)
        out = gen(theirs, a)
        assert out.cached_tokens == 0
        assert theirs.engine.cache.l3.hit_tokens == 0
        want = LLM("tiny", loaded=other, prefix_cache=False, **BASE)
        assert out.token_ids == want.generate({"prompt_token_ids": a}, GREEDY)[0].token_ids
        mine.engine.close()
        theirs.engine.close()


def test_a_dead_cluster_master_misses_only_its_keys(loaded, ref):
    a = ids(N, 8)
    with RedisCluster3() as cluster:
        first = engine(loaded, cluster.url)
        assert written(first, a).token_ids == ref(a)
        warm = engine(loaded, cluster.url)
        out = gen(warm, a)
        assert out.token_ids == ref(a) and out.cached_tokens == FULL_HIT, errors(warm)
        cache = warm.engine.cache
        keys = cache.keys.page_keys(a[:FULL_HIT], None)
        cluster.kill(0)
        # The pages whose keys lived on node 0 are gone; every other page is still there.
        full_node = cluster.node_of([cache.keys.name("f", k) for k in keys])
        swa_node = cluster.node_of([cache.keys.name("s", k) for k in keys])
        have_swa = first.engine.cache.tree.path_pages(a[:FULL_HIT], None)[1]
        expect = best_hit([n != 0 for n in full_node],
                          [s >= 0 and n != 0 for s, n in zip(have_swa, swa_node)],
                          W, PAGE) * PAGE
        cold = engine(loaded, cluster.url)
        out = gen(cold, a)
        assert out.token_ids == ref(a)
        assert out.cached_tokens == expect
        assert sum(errors(cold).values()) > 0
        for x in (first, warm, cold):
            x.engine.close()


def test_keep_alive_keeps_a_hot_prefix_in_an_lru_redis(loaded, ref):
    """A prefix that keeps hitting in L1 touches its Redis keys, so Redis's LRU keeps it
    while colder prefixes go. (Redis's LRU clock ticks once a second: each touch comes more
    than a second after the cold prefix before it was written, so the hot keys are strictly
    younger than every cold one but the newest.)"""
    hot = ids(N, 9)
    with RedisServer(maxmemory="2500kb", policy="allkeys-lru",
                     args=("--maxmemory-samples", "10")) as redis:
        llm = engine(loaded, redis.url, kv_keepalive=0.001)
        written(llm, hot)
        for i in range(8):                      # ~0.35 MB each (an empty Redis uses ~0.9 MB)
            written(llm, ids(N, 100 + i))
            time.sleep(1.05)                    # the touch below lands a clock tick later
            out = gen(llm, hot)                 # an L1 hit: touches the hot keys in Redis
            assert out.cached_tokens == FULL_HIT
            llm.engine.flush_tiers()
        assert llm.engine.cache.storage.storage.stats.touches > 0
        llm.engine.close()
        pk = llm.engine.cache.keys.page_keys(hot[:FULL_HIT])
        cl = redis.client()
        present = (sum(cl.exists(llm.engine.cache.keys.name("f", k)) for k in pk),
                   [i for i, k in enumerate(pk) if cl.exists(llm.engine.cache.keys.name("s", k))])
        fresh = engine(loaded, redis.url)
        out = gen(fresh, hot)
        st = fresh.engine.cache.storage
        assert out.token_ids == ref(hot) and out.cached_tokens == FULL_HIT, (
            present, st.storage.stats.gets, st.storage.stats.hits, redis.client().dbsize())
        cold_hits = sum(gen(fresh, ids(N, 100 + i)).cached_tokens == FULL_HIT for i in range(4))
        assert cold_hits == 0                   # the oldest cold prefixes were evicted
        fresh.engine.close()
