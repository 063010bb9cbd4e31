"""Partial pages (radix/tails.py): the first rows of a cached page reach a new request by
copy. Each request here writes K/V values that name their layer, position and slot row, so
the rows a later request finds in its own page are checked against values computed in the
test, not read back through the code under test."""
from __future__ import annotations

import pytest
import torch

from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import KVLayout, LayerKV
from mimo.kvcache.radix.cache import RadixPrefixCache

P, W = 4, 6


def layout(hybrid: bool) -> KVLayout:
    full = (LayerKV(1, 2, 2),)
    swa = (LayerKV(2, 3, 1), LayerKV(2, 3, 1))
    if not hybrid:
        return KVLayout(full + swa, (), W, 4, hybrid=False)
    return KVLayout(full, swa, W, 4)


def value(kind: str, layer: int, pos: int) -> float:
    """What a request 'computes' for a position: the same tokens at the same positions
    give the same KV, as in a model."""
    return {"k": 1.0, "v": 2.0}[kind] * 1000 + layer * 100 + pos


def pools(dp: DualPool):
    return [(dp.full, dp.full_slots)] + ([(dp.swa, dp.swa_slots)] if dp.hybrid else [])


def compute(dp: DualPool, seq, lo: int, hi: int) -> None:
    """Write positions [lo, hi) of `seq` (its pages grown) as a forward would."""
    dp.grow(seq, hi)
    for pool, slots in pools(dp):
        s = slots(seq, lo, hi)
        for i in range(len(pool.layers)):
            for kind, store in (("k", pool.k(i)), ("v", pool.v(i))):
                store[s] = torch.tensor([value(kind, i, p) for p in range(lo, hi)],
                                        dtype=store.dtype)[:, None, None]


def first_live(seq) -> int:
    """First position whose SWA page the request's table still holds."""
    return next((g * P for g, p in enumerate(seq.swa_pages) if p is not None), 0)


def read(dp: DualPool, seq, hi: int) -> list[list[float]]:
    """Every layer's K and V values of positions [0, hi) (SWA layers: from the first page
    the request holds)."""
    out = []
    for pool, slots in pools(dp):
        s = slots(seq, first_live(seq) if pool is dp.swa else 0, hi)
        for i in range(len(pool.layers)):
            for store in (pool.k(i), pool.v(i)):
                out.append(store[s][:, 0, 0].tolist())
    return out


def expected(dp: DualPool, seq, hi: int) -> list[list[float]]:
    return [[value(kind, i, p) for p in range(first_live(seq) if pool is dp.swa else 0, hi)]
            for pool, _ in pools(dp) for i in range(len(pool.layers)) for kind in ("k", "v")]


def balanced(dp: DualPool, cache: RadixPrefixCache) -> None:
    cache.check_integrity()
    dp.check_integrity()
    for a in (dp.full.allocator, dp.swa.allocator):
        assert a.num_free + a.num_evictable + a.num_in_use == a.capacity, a.name


def run(dp, cache, tokens: list[int]) -> tuple[int, bool]:
    """A request over `tokens` (its prompt): admission, the rest computed, finished.
    Returns (cached tokens, whether the cached rows it found hold the right values)."""
    seq = dp.new_seq()
    cached = cache.admit(seq, tokens, len(tokens), len(tokens) + 4)
    right = read(dp, seq, cached) == expected(dp, seq, cached)
    compute(dp, seq, cached, len(tokens))
    cache.finish(seq, tokens, len(tokens))
    return cached, right


@pytest.mark.parametrize("hybrid", [True, False])
def test_a_finished_requests_partial_page_is_copied_into_the_next_ones_page(hybrid):
    dp = DualPool(layout(hybrid), full_pages=16, swa_pages=16, page_size=P)
    cache = RadixPrefixCache(dp, "keep-all")
    toks = list(range(10, 20))                       # 10 tokens: 2 whole pages, 2 left over
    assert run(dp, cache, toks)[0] == 0
    assert cache.tree.stats()["tails"] == 1
    balanced(dp, cache)
    # The same prompt and one more token: all 10 are cached, 8 by whole pages, 2 copied.
    cached, right = run(dp, cache, toks + [99])
    assert (cached, right) == (10, True)
    assert cache.counters()["partial_tokens"] == 2
    balanced(dp, cache)
    # Diverging after the first leftover token: 9.
    cached, right = run(dp, cache, toks[:9] + [77, 5])
    assert (cached, right) == (9, True)
    balanced(dp, cache)


@pytest.mark.parametrize("hybrid", [True, False])
def test_the_first_rows_of_a_whole_cached_page_are_copied(hybrid):
    dp = DualPool(layout(hybrid), full_pages=16, swa_pages=16, page_size=P)
    cache = RadixPrefixCache(dp, "keep-all")
    toks = list(range(30, 42))                       # 12 tokens: 3 whole pages
    run(dp, cache, toks)
    assert cache.tree.stats()["tails"] == 0
    # 4 + 3 tokens agree: the second page's first 3 rows are copied (its last one differs).
    cached, right = run(dp, cache, toks[:7] + [1, 2])
    assert (cached, right) == (7, True)
    # The cached page itself stays as it was: the copy went into the request's own page.
    cached, right = run(dp, cache, toks + [3])
    assert (cached, right) == (12, True)
    balanced(dp, cache)


def test_no_copy_where_the_prompt_must_compute_its_last_token():
    """Admission matches all but the last prompt token, partial rows included."""
    dp = DualPool(layout(True), full_pages=16, swa_pages=16, page_size=P)
    cache = RadixPrefixCache(dp, "keep-all")
    run(dp, cache, list(range(10)))
    assert run(dp, cache, list(range(10)))[0] == 9     # 8 whole + 1 copied; token 9 computed
    assert run(dp, cache, list(range(9)))[0] == 8       # the page boundary: nothing copied
    balanced(dp, cache)


def test_tails_go_first_under_pressure_and_with_their_node():
    dp = DualPool(layout(True), full_pages=16, swa_pages=16, page_size=P)
    cache = RadixPrefixCache(dp, "keep-all")
    run(dp, cache, list(range(10)))                   # tail at 8
    run(dp, cache, list(range(50, 56)))               # another: tail at 4
    assert cache.tree.stats()["tails"] == 2
    free = dp.full.allocator.num_free
    cache.make_room(free + 1, 0)                      # one page more than is free
    # The older tail went, nothing else: both prompts still match their whole pages.
    assert cache.tree.stats()["tails"] == 1
    assert cache.cached_len(list(range(10))) == 8 and cache.cached_len(list(range(50, 56))) == 4
    assert run(dp, cache, list(range(10)) + [1])[0] == 8
    balanced(dp, cache)
    # Everything evicted: the nodes take their tails with them, every page comes back.
    cache.make_room(dp.full.allocator.capacity, dp.swa.allocator.capacity)
    assert cache.tree.stats()["tails"] == 0
    assert dp.full.allocator.num_free == dp.full.allocator.capacity
    assert dp.swa.allocator.num_free == dp.swa.allocator.capacity
    balanced(dp, cache)


def test_a_newer_tail_replaces_the_older_and_a_full_pool_hands_the_tail_over():
    dp = DualPool(layout(True), full_pages=6, swa_pages=6, page_size=P)
    cache = RadixPrefixCache(dp, "keep-all")
    run(dp, cache, [1, 2, 3, 4, 5])
    run(dp, cache, [1, 2, 3, 4, 6, 7])
    assert cache.tree.stats()["tails"] == 1
    assert run(dp, cache, [1, 2, 3, 4, 6, 7, 8]) == (6, True)     # the newer tail's two rows
    balanced(dp, cache)
    # Every free page held by a running request: no page to copy into, so the tail's own
    # pages become the request's (making room would have evicted that very tail).
    busy = dp.new_seq()
    cache.make_room(dp.full.allocator.capacity, dp.swa.allocator.capacity)
    run(dp, cache, [1, 2, 3, 4, 6, 7])
    assert cache.tree.stats()["tails"] == 1
    dp.grow(busy, P * min(dp.full.allocator.num_free, dp.swa.allocator.num_free))
    assert dp.full.allocator.num_free == 0
    seq = dp.new_seq()
    assert cache.admit(seq, [1, 2, 3, 4, 6, 7, 9], 7, 9) == 6
    assert cache.tree.stats()["tails"] == 0
    assert read(dp, seq, 6) == expected(dp, seq, 6)
    balanced(dp, cache)
    compute(dp, seq, 6, 7)
    cache.finish(seq, [1, 2, 3, 4, 6, 7, 9], 7)          # its page is a tail again
    assert cache.tree.stats()["tails"] == 1
    dp.free_seq(busy)
    balanced(dp, cache)
    cache.make_room(dp.full.allocator.capacity, dp.swa.allocator.capacity)
    assert dp.full.allocator.num_free == dp.full.allocator.capacity
    assert dp.swa.allocator.num_free == dp.swa.allocator.capacity
