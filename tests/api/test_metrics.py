"""/metrics exports the prefix cache's running totals as the tree counts them, read from the
engine's snapshot (EngineStats)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mimo.api.metrics import Metrics
from mimo.engine.face import EngineStats
from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import shape_layout
from mimo.kvcache.radix.cache import RadixPrefixCache
from mimo.kvcache.radix.retention import RetentionPolicy


def samples(metrics: Metrics) -> dict:
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def cached_prompt(pages: int):
    """A Gemma 3 270M prefix cache (window 512, page 16) watched by /metrics, holding one
    prompt of `pages` pages that kept a window at its end only."""
    pool = DualPool(shape_layout("gemma-3-270m"), pages, pages, 16, allocate=False)
    cache = RadixPrefixCache(pool, RetentionPolicy(branch=False))
    tree, fa, sa = cache.tree, pool.full.allocator, pool.swa.allocator
    metrics = Metrics()
    # What the engine thread's snapshot holds of the cache (engine/snapshot.py).
    metrics.watch_engine(lambda: EngineStats(cache=cache.counters()))
    toks = list(range(pages * 16))
    res = tree.insert(toks, fa.alloc(pages), sa.alloc(pages), prompt_len=len(toks))
    fa.free(res.dup_full)
    sa.free(res.dup_swa)
    return cache, metrics, toks


def test_window_cuts_and_evictions_are_exported():
    cache, metrics, toks = cached_prompt(128)
    tree, fa, sa = cache.tree, cache.pool.full.allocator, cache.pool.swa.allocator
    # A fork 1024 tokens in: token-equal for 1024, but the only window ends at 2048.
    assert tree.match(toks[:1024] + [10**6]).length == 0
    tree.evict(full=128)
    tree.check_integrity()
    got = samples(metrics)
    cut = "mimo_prefix_cache_window_cut_tokens_total"
    assert got[(cut, (("cause", "never_kept"),))] == 1024
    assert got[(cut, (("cause", "evicted"),))] == 0
    freed = "mimo_prefix_cache_freed_pages_total"
    assert got[(freed, (("how", "node"), ("pool", "full")))] == 128
    # The prompt-end windows (before 2032 = the prompt less its last token, page-aligned,
    # and before 2048): pages 95..127, as the tree owns exactly those.
    assert got[(freed, (("how", "node"), ("pool", "swa")))] == 33
    assert got[(freed, (("how", "swa_only"), ("pool", "swa")))] == 0
    assert got[("mimo_prefix_cache_revived_swa_pages_total", ())] == 0
    assert fa.num_free == fa.capacity and sa.num_free == sa.capacity


def test_window_rebuilds_are_exported():
    # Gemma 3 270M: 15 SWA layers of window 512, so a rebuild recomputes 15 * 511 tokens.
    cache, metrics, toks = cached_prompt(768)
    tree = cache.tree
    # A fork at 9216: its window (from 8705, page 544) comes out exact from a start at
    # 8704 - (7665 - 511) = 1550, page-aligned down: 1536 tokens reused, 7680 cut.
    m = tree.match(toks[:9216] + [10**6], rebuild=cache.rebuild)
    assert (m.length, m.full_len) == (1536, 9216)
    got = samples(metrics)
    assert got[("mimo_prefix_cache_rebuilt_tokens_total", ())] == 1536
    cut = "mimo_prefix_cache_window_cut_tokens_total"
    assert got[(cut, (("cause", "never_kept"),))] == 9216 - 1536


def test_partial_page_rows_are_exported():
    """A prompt ending 5 tokens into the page after the cached ones: admission copies 5
    rows of the cached page that goes on from there (bookkeeping pool: the count only)."""
    cache, metrics, toks = cached_prompt(8)
    seq = cache.pool.new_seq()
    assert cache.admit(seq, toks[:16 * 3 + 5] + [10**6], 54, 60) == 16 * 3 + 5
    cache.release(seq)
    cache.check_integrity()
    assert samples(metrics)[("mimo_prefix_cache_partial_tokens_total", ())] == 5
