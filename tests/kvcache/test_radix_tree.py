"""SWA-aware radix tree: the rules of DESIGN.md section 4, one scenario each.

Page size 4 and window 8 throughout: a prefix of length L needs live SWA on the pages
holding positions [L - 7, L), i.e. pages (L - 7) // 4 .. L // 4 - 1 (two or three pages).
"""
from __future__ import annotations

import pytest
from helpers.radix_model import brute_match, flatten

from mimo.kvcache.pool.allocator import EVICTABLE, IN_USE, PageAllocator
from mimo.kvcache.radix.retention import RetentionPolicy
from mimo.kvcache.radix.tree import RadixTree

P, W = 4, 8
KEEP = RetentionPolicy(keep_all=True)


def make(mode="hybrid", policy=KEEP, pages=64, rebuild=0):
    fa, sa = PageAllocator(pages, "full"), PageAllocator(pages, "swa")
    return RadixTree(P, W, fa, sa if mode == "hybrid" else None, policy, mode,
                     rebuild=rebuild), fa, sa


def run(tree, toks, live=None, ns=None, prompt_len=None):
    """One request: match, lock, compute the rest, keep SWA on pages in `live` (all if
    None), insert, free duplicates, unlock. Returns (match, insert result)."""
    fa, sa = tree.full_alloc, tree.swa_alloc
    m = tree.match(toks, ns)
    tree.lock(m.node)
    q0, n = m.length // P, -(-len(toks) // P)
    full = m.full_pages + fa.alloc(n - q0)
    swa = None
    if tree.hybrid:
        swa = list(m.swa_pages) + sa.alloc(n - q0)
        for i in range(q0, n):
            if live is not None and i not in live:
                sa.free([swa[i]])
                swa[i] = None
    res = tree.insert(toks, full, swa, ns, prompt_len=prompt_len)
    fa.free(res.dup_full)
    if sa is not None:
        sa.free(res.dup_swa)
    tree.unlock(m.node)
    tree.check_integrity()
    return m, res


def seq(n, base=0):
    return list(range(base, base + n))


def test_match_is_cut_back_to_the_last_live_window():
    tree, fa, sa = make()
    # 40 tokens; SWA kept for the window before 20 (pages 3, 4) and the tail (pages 8, 9).
    run(tree, seq(40), live={3, 4, 8, 9})
    assert flatten(tree) and tree.stats()["swa_live_pages"] == 4
    for n, want in [(40, 40), (39, 20), (36, 20), (24, 20), (20, 20), (19, 0), (8, 0)]:
        m = tree.match(seq(n))
        assert m.length == want, (n, m.length)
        assert (m.length, m.prefix_len) == brute_match(flatten(tree), None, seq(n), P, W)
        assert m.prefix_len == n // P * P
    m = tree.match(seq(20))
    assert m.swa_first == 3 and m.swa_pages[:3] == [None] * 3
    assert all(s is not None and s >= 0 for s in m.swa_pages[3:])
    assert len(m.full_pages) == 5 and len(set(m.full_pages)) == 5


def test_short_prefix_needs_live_swa_from_the_root():
    tree, *_ = make()
    run(tree, seq(12), live={1, 2})          # page 0 released: no prefix shorter than 8 ...
    assert tree.match(seq(4)).length == 0
    assert tree.match(seq(8)).length == 0    # ... and 8 needs positions 1..7: pages 0, 1
    assert tree.match(seq(12)).length == 12  # 12 needs positions 5..11: pages 1, 2
    tree2, *_ = make()
    run(tree2, seq(12))
    assert [tree2.match(seq(n)).length for n in (4, 8, 12)] == [4, 8, 12]


def test_lock_keeps_full_path_and_only_the_window_of_swa():
    tree, fa, sa = make()
    run(tree, seq(40))                       # every SWA page live
    m = tree.match(seq(24))
    tree.lock(m.node)
    assert tree.evict(64, 64) == (4, 10 - 2)  # pages 6..9 whole; SWA of pages 0..3, 6..9
    tree.check_integrity()
    assert tree.match(seq(40)).length == 24   # full [0, 24) and SWA pages 4, 5 survive
    assert [fa._state[p] for p in m.full_pages] == [IN_USE] * 6
    assert fa.num_in_use == 6 and sa.num_in_use == 2 and fa.num_evictable == 0
    tree.unlock(m.node)
    tree.check_integrity()
    assert fa.num_evictable == 6 and sa.num_evictable == 2
    tree.evict(64, 64)
    tree.check_integrity()
    assert fa.num_free == 64 and sa.num_free == 64 and tree.stats()["nodes"] == 0


def test_swa_eviction_tombstones_interior_keeps_leaf_tails():
    tree, fa, sa = make()
    branch = seq(20) + seq(20, 100)
    run(tree, seq(40), prompt_len=21)        # checkpoint at 20: nodes [0, 20) [20, 40)
    run(tree, branch)                        # a second leaf below 20
    tree.match(seq(40))                      # both leaves used after the branch point's SWA
    tree.match(branch)
    # The SWA order picks the interior node (its SWA last used when the branch matched it):
    # all 5 of its SWA pages go, no leaf window reaches back into it, no full page goes.
    assert tree.evict(0, 1) == (0, 5)
    tree.check_integrity()
    assert tree.match(seq(20)).length == 0
    assert tree.match(seq(40)).length == 40 and tree.match(branch).length == 40
    # Leaves keep their tails: more SWA pressure evicts leaves whole, never tombstones them.
    assert tree.evict(0, 5) == (5, 5)        # the older leaf, [20, 40) of seq(40)
    tree.check_integrity()
    assert tree.match(branch).length == 40 and tree.match(seq(40)).length == 0
    # The last leaf goes, and its parent, a tombstone now a leaf, with it.
    assert tree.evict(0, 1) == (10, 5)
    tree.check_integrity()
    assert tree.stats()["nodes"] == 0 and fa.num_free == sa.num_free == 64


def test_window_cuts_are_counted_by_cause():
    """A cut at a window nobody kept is a fork retention did not foresee; a cut at a window
    that SWA-only eviction freed is pool pressure. Lookups that are not admissions
    (count=False) stay out of both."""
    tree, *_ = make()
    run(tree, seq(40), live={3, 4, 8, 9})    # windows before 20 and 40 only
    assert tree.match(seq(36)).length == 20  # window before 36 = pages 7, 8: 7 never kept
    assert (tree.counters["cut_never_kept"], tree.counters["cut_evicted"]) == (16, 0)
    tree.match(seq(36), count=False)
    assert tree.counters["cut_never_kept"] == 16
    tree2, *_ = make()
    run(tree2, seq(40), prompt_len=21)       # nodes [0, 20) [20, 40), every page live
    run(tree2, seq(20) + seq(20, 100))
    tree2.match(seq(40))
    tree2.match(seq(20) + seq(20, 100))
    assert tree2.evict(0, 1) == (0, 5)       # [0, 20)'s SWA freed, its full KV kept
    assert tree2.match(seq(20)).length == 0
    assert (tree2.counters["cut_never_kept"], tree2.counters["cut_evicted"]) == (0, 20)
    assert tree2.match(seq(40)).length == 40   # no cut, nothing counted
    assert tree2.counters["cut_evicted"] == 20


def test_evicting_a_leaf_trims_a_parent_with_a_dead_tail():
    tree, fa, sa = make()
    run(tree, seq(40), live={3, 4, 8, 9}, prompt_len=21)
    run(tree, seq(32) + seq(8, 200), live={6, 7, 8, 9})   # branch at 32: window 6, 7 live
    assert tree.match(seq(32)).length == 32
    tree.evict(0, 2)      # SWA-only eviction may tombstone the branch window (pages 6, 7)
    tree.check_integrity()
    # Whatever went, every leaf still ends window-safe and matches agree with brute force.
    for q in (seq(40), seq(32) + seq(8, 200), seq(32), seq(28)):
        assert tree.match(q).length == brute_match(flatten(tree), None, q, P, W)[0]
    tree.evict(64, 0)
    tree.check_integrity()
    assert fa.num_free == 64 and sa.num_free == 64


def test_parent_left_as_tombstone_is_trimmed_to_its_checkpoint():
    tree, fa, sa = make()
    run(tree, seq(40), live={3, 4, 8, 9}, prompt_len=21)   # nodes [0,20) [20,40)
    run(tree, seq(28) + seq(12, 300), live={5, 6, 8, 9})    # branch at 28: window 5, 6 live
    node28 = tree.match(seq(28)).node
    assert node28.end == 28
    # Evict both leaves below 28: the [20, 28) segment keeps a live tail window (5, 6).
    tree.evict(5, 0)
    tree.check_integrity()
    assert tree.match(seq(40)).length in (20, 28)
    tree.evict(64, 0)
    tree.check_integrity()
    assert tree.stats()["nodes"] == 0 and sa.num_free == 64


def test_insert_of_cached_prefix_returns_the_callers_duplicates():
    tree, fa, sa = make()
    a_full, a_swa = fa.alloc(5), sa.alloc(5)
    b_full, b_swa = fa.alloc(5), sa.alloc(5)
    ra = tree.insert(seq(20), a_full, a_swa)
    assert ra.dup_full == [] and ra.dup_swa == []
    rb = tree.insert(seq(20), b_full, b_swa)   # computed concurrently: all duplicates
    assert sorted(rb.dup_full) == sorted(b_full) and sorted(rb.dup_swa) == sorted(b_swa)
    fa.free(rb.dup_full)
    sa.free(rb.dup_swa)
    tree.check_integrity()
    assert fa.num_evictable == 5 and fa.num_in_use == 0
    with pytest.raises(ValueError):
        tree.insert(seq(3), fa.alloc(2), None)


def test_insert_revives_tombstones_and_reports_remap():
    tree, fa, sa = make()
    run(tree, seq(40), live={3, 4, 8, 9})
    m, res = run(tree, seq(36) + [999])     # cut back to 20, recomputes [20, 37)
    assert m.length == 20 and m.prefix_len == 36
    # Pages 5..7 of the tree are tombstones the request recomputed: revived with its pages;
    # its page 8 duplicates a live one and its partial page 9 is not cached: both returned.
    assert len(res.remap) == 3 and tree.counters["revived_swa"] == 3
    assert len(res.dup_swa) == 2 and len(res.dup_full) == 5
    assert tree.match(seq(36)).length == 36 and tree.match(seq(28)).length == 28
    tree_full = {fp for fp, _ in res.remap}
    assert tree_full <= {v[0] for v in flatten(tree).values()}


def test_namespaces_do_not_share():
    tree, *_ = make()
    run(tree, seq(16), ns="img-a")
    assert tree.match(seq(16), "img-a").length == 16
    assert tree.match(seq(16), "img-b").length == 0 and tree.match(seq(16)).length == 0


def test_match_node_reference_survives_later_splits():
    tree, *_ = make()
    run(tree, seq(40))
    m = tree.match(seq(40))
    tree.lock(m.node)
    run(tree, seq(12) + seq(20, 500))       # splits the locked path at 12
    assert m.node.end == 40 and m.node.alive
    tree.unlock(m.node)
    tree.check_integrity()


def test_full_kv_mode_is_a_plain_prefix_cache():
    tree, fa, _ = make("full-kv")
    run(tree, seq(40))
    assert [tree.match(seq(n)).length for n in (39, 8, 3)] == [36, 8, 0]
    assert tree.match(seq(8)).swa_pages == []
    tree.evict(64)
    tree.check_integrity()
    assert fa.num_free == 64


def test_cache_off_returns_everything():
    tree, fa, sa = make("off")
    m, res = run(tree, seq(20))
    assert m.length == 0 and len(res.dup_full) == 5 and res.cached_len == 0
    assert fa.num_free == 64
    assert tree.insert(seq(8), [1, 2], [3, None]).dup_swa == [3]


def test_real_policy_keeps_only_checkpoint_windows():
    tree, fa, sa = make(policy=RetentionPolicy())
    run(tree, seq(60), prompt_len=41)       # checkpoints: prompt end 40, tail 60
    st = tree.stats()
    assert st["swa_live_pages"] == 4 and st["cached_tokens"] == 60 and st["nodes"] == 2
    assert tree.match(seq(60)).length == 60 and tree.match(seq(44)).length == 40
    assert tree.match(seq(39)).length == 0
    assert {fa._state[v[0]] for v in flatten(tree).values()} == {EVICTABLE}
    assert sa.num_free == 60 and sa.num_evictable == 4


def test_rebuild_match_hands_over_full_kv_past_a_dead_window():
    """A fork where no window was kept: with `rebuild` (the SWA receptive field) the match
    starts that many tokens (page-aligned so the whole window before the fork comes out
    exact) before the fork and hands over the full KV up to it; no SWA pages."""
    R = 3 * (W - 1)                             # three SWA layers' receptive field
    tree, fa, sa = make()
    run(tree, seq(80), live={18, 19})           # only the tail window is live
    fork = seq(60) + [999] * 8
    assert tree.match(fork, count=False).length == 0
    assert tree.peek(fork, rebuild=R) == 36
    m = tree.match(fork, rebuild=R)
    # The window before 60 is pages 13, 14 (positions 53..59); SWA is exact from
    # start + R - (W - 1), so start = (52 - 14) // 4 pages = 9.
    assert (m.length, m.full_len, m.prefix_len, m.rebuild) == (36, 60, 60, True)
    assert len(set(m.full_pages)) == 15
    assert m.swa_pages == [None] * 9 and m.swa_first == 9
    assert tree.counters["rebuilt_tokens"] == 36
    assert tree.match(seq(60) + [999] * 8, rebuild=60, count=False).full_len == 0  # too far back
    # The request: full KV of [0, 60) is the tree's; it computes SWA from 36 and full from
    # 60; SWA of pages starting before 36 + R - (W - 1) = 50 is inexact and never offered.
    tree.lock(m.node, window=False)
    assert [fa._state[p] for p in m.full_pages] == [IN_USE] * 15
    n = len(fork) // P
    full = m.full_pages + fa.alloc(n - 15)
    swa = [None] * 9 + sa.alloc(n - 9)
    offered = [s if i >= 13 else None for i, s in enumerate(swa)]
    sa.free([s for s, o in zip(swa, offered) if s is not None and o is None])
    res = tree.insert(fork, full, offered)
    fa.free(res.dup_full)
    sa.free(res.dup_swa)
    tree.unlock(m.node, window=False)
    tree.check_integrity()
    # The window before the fork was revived from the rebuild (pages 13, 14), and the
    # inexact pages 9..12 stayed tombstones: the fork point is window-safe now.
    assert tree.match(seq(60), count=False).length == 60
    assert tree.match(seq(52), count=False).length == 0
    assert tree.match(fork, count=False).length == 68


def test_rebuild_lock_keeps_full_kv_and_unlock_trims_a_dead_leaf():
    R = 3 * (W - 1)
    tree, fa, sa = make()
    run(tree, seq(80), live={18, 19})
    m = tree.match(seq(60) + [999] * 8, rebuild=R)
    tree.lock(m.node, window=False)
    tree.evict(64, 64)          # everything unlocked: the tail node and its window
    tree.check_integrity()      # a rebuild-locked leaf may end in a dead window
    assert fa.num_in_use == 15 and sa.num_in_use == 0
    assert tree.match(seq(80), count=False).prefix_len == 60
    tree.unlock(m.node, window=False)
    tree.check_integrity()      # ... but not once unlocked: no window-safe end is left
    assert tree.stats()["nodes"] == 0 and fa.num_free == 64 and sa.num_free == 64


@pytest.mark.parametrize("rebuild", [0, 3 * (W - 1)], ids=["no-rebuild", "rebuild"])
def test_evicting_a_child_cuts_its_parent_back_even_where_a_rebuild_would_reach(rebuild):
    """Nodes [0, 56), [56, 60), [60, 80); SWA live only on the tail window. Evicting the tail
    leaves [56, 60) a leaf whose window is gone, and nothing before it is window-safe: the
    whole path goes, with rebuild too (a rebuild from 60 could start at 36, but a subtree
    that aged out is not worth its full KV to a rebuild)."""
    tree, fa, sa = make(rebuild=rebuild)
    run(tree, seq(80), live={18, 19}, prompt_len=60)     # prompt checkpoints split at 56, 60
    assert tree.stats()["nodes"] == 3
    assert tree.evict(5) == (20, 2)
    tree.check_integrity()
    assert tree.stats()["nodes"] == 0 and fa.num_free == sa.num_free == 64


def test_evicting_a_child_still_cuts_back_to_a_safe_point_past_the_rebuild():
    """The same path with the window before 56 live too: a rebuild from 60 would start at
    36, before that safe point, so the leaf [56, 60) is cut as without rebuild."""
    tree, fa, sa = make(rebuild=3 * (W - 1))
    run(tree, seq(80), live={12, 13, 18, 19}, prompt_len=60)
    assert tree.evict(5)[0] == 6        # the tail and [56, 60)
    tree.check_integrity()
    assert tree.stats()["cached_tokens"] == 56 and tree.match(seq(61)).length == 56


def test_swa_pressure_frees_a_long_leafs_window_but_drops_a_short_leaf():
    """With rebuild, SWA-only eviction may free the tail window of a leaf a rebuild can
    reach (its full KV stays and a match rebuilds); a leaf shorter than the receptive field
    keeps its window protected, so pressure that needs those pages drops the leaf whole."""
    R = 3 * (W - 1)
    tree, fa, sa = make(rebuild=R)
    run(tree, seq(80), live={18, 19})
    run(tree, seq(8, base=500))         # all its SWA is its window: nothing freeable alone
    assert tree.evict(0, 2) == (0, 2)   # the long leaf's window: older, and unprotected
    tree.check_integrity()
    assert tree.stats()["cached_tokens"] == 88 and tree.stats()["swa_live_pages"] == 2
    m = tree.match(seq(81))             # (and now the long leaf is the newer one)
    assert (m.length, m.full_len) == (56, 80)
    assert tree.evict(0, 1) == (2, 2)   # no window is freeable alone: the short leaf goes
    tree.check_integrity()
    assert tree.stats()["cached_tokens"] == 80 and sa.num_free == 64


def test_a_leaf_whose_last_safe_point_went_can_lose_its_window_next():
    """Nodes [0, 68), [68, 72), [72, 80); SWA live before 68 and on the tail. The window
    before 68 lies in the tail's last receptive field, so the tail window is protected and
    the first SWA pressure frees the one before 68 (older). That unprotects the tail
    window: the next pressure must find it and free it alone, keeping all the full KV."""
    tree, fa, sa = make(rebuild=3 * (W - 1))
    run(tree, seq(80), live={15, 16, 18, 19}, prompt_len=72)
    assert tree.stats()["nodes"] == 3
    tree.match(seq(68))                         # the window before 68: last used now
    pages = [v[0] for k, v in sorted(flatten(tree).items(), key=lambda kv: len(kv[0][1]))]
    assert tree.insert(seq(80), pages).dup_full == []     # a use of the path, no window
    tree.check_integrity()
    assert tree.evict(0, 2) == (0, 2)           # the window before 68
    assert tree.evict(0, 2) == (0, 2)           # then the tail window, alone
    tree.check_integrity()
    assert tree.stats()["cached_tokens"] == 80 and tree.stats()["swa_live_pages"] == 0
    assert tree.match(seq(81)).length == 56     # a rebuild from 80's window


def test_num_leaves_counts_cached_sequence_ends():
    """Leaves are the ends a window is kept for: a sequence another one extends is none,
    a fork adds one, namespaces count apart, eviction takes them away."""
    tree, fa, sa = make()
    assert tree.num_leaves() == 0
    run(tree, seq(16))
    run(tree, seq(24))                          # extends the first: still one end
    assert tree.num_leaves() == 1
    run(tree, seq(12) + seq(8, 100))            # forks at 12
    run(tree, seq(16), ns="salt")               # same tokens, another namespace
    assert tree.num_leaves() == 3
    tree.evict(full=fa.capacity)
    assert tree.num_leaves() == 0
    tree.check_integrity()


def test_a_continued_leaf_keeps_its_place_in_the_swa_order_at_window_1():
    """Found by the property test: a request that continues a cached leaf moves the leaf's
    SWA time (its window becomes a fallback). The tree re-entered the nodes holding the
    leaf's tail window in the SWA heap, but with a window of 1 token that window lies past
    the leaf, so the leaf itself had no valid entry: SWA eviction lost track of its pages
    and had to rebuild its heaps (`reheaps`)."""
    p, w = 3, 1
    fa, sa = PageAllocator(16, "full"), PageAllocator(16, "swa")
    tree = RadixTree(p, w, fa, sa, KEEP, "hybrid")

    def req(toks):
        m = tree.match(toks)
        tree.lock(m.node)
        q0, n = m.length // p, -(-len(toks) // p)
        res = tree.insert(toks, m.full_pages + fa.alloc(n - q0),
                          list(m.swa_pages) + sa.alloc(n - q0), None)
        fa.free(res.dup_full)
        sa.free(res.dup_swa)
        tree.unlock(m.node)
        tree.check_integrity()
    req(seq(6))
    req(seq(9))             # continues the leaf [0, 6)
    assert sa.num_evictable == 3
    # A 1-token window needs no SWA before the leaf's end: the two pages of [0, 6) go first,
    # without touching the leaf's full KV.
    assert tree.evict(0, 2) == (0, 2) and sa.num_evictable == 1
    assert tree.counters["reheaps"] == 0
    tree.check_integrity()
