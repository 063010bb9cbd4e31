"""Retention policy: checkpoint positions and the pages their windows need, by hand."""
from __future__ import annotations

import pytest

from mimo.kvcache.pool.allocator import PageAllocator
from mimo.kvcache.radix.retention import POLICIES, RetentionPolicy, window_first_page, window_pages
from mimo.kvcache.radix.tree import SPECULATIVE, RadixTree


def test_window_pages_match_window_release():
    # W=128, P=16: a prefix of 512 needs positions 385..511, pages 24..31.
    assert window_pages(512, 128, 16) == range(24, 32)
    assert window_first_page(100, 128, 16) == 0 and window_pages(96, 128, 16) == range(0, 6)
    # W not a multiple of P: W=8, P=4 at 20 needs positions 13..19: pages 3, 4.
    assert window_pages(20, 8, 4) == range(3, 5)
    assert window_pages(0, 8, 4) == range(0, 0)


def test_checkpoints_by_rule():
    P = 16
    pol = RetentionPolicy(align=512)
    # 1300-token prompt + 200 output: cached end 1024 (1499 rounded down), prompt end 1024.
    assert pol.checkpoints(1499, 1300, 0, P) == [1024]
    # Branch at 640 (page aligned, not block aligned): kept as is.
    assert pol.checkpoints(1499, 1300, 640, P) == [640, 1024]
    # Output crossing a block: the cached end moves into it.
    assert pol.checkpoints(1700, 1300, 0, P) == [1024, 1536]
    assert RetentionPolicy(align=512, output=False).checkpoints(1700, 1300, 0, P) == [1024]
    # A prompt of whole blocks: the identical prompt can reuse only 1536 of it (its last
    # token is recomputed), the next turn all 2048.
    assert pol.checkpoints(2100, 2048, 0, P) == [1536, 2048]
    assert RetentionPolicy(branch=False).checkpoints(100, 50, 32, P) == [48, 96]
    assert RetentionPolicy(prompt=False, branch=False).checkpoints(100, 50, 32, P) == [96]
    with pytest.raises(ValueError):
        RetentionPolicy(align=100).checkpoints(1000, 900, 0, P)


def test_dense_checkpoints_are_speculative():
    pol = RetentionPolicy(dense_every=64)
    assert pol.checkpoints(300, 300, 0, 16) == [64, 128, 192, 256, 288]
    assert pol.checkpoints(300, 300, 0, 16, firm_only=True) == [288]
    assert RetentionPolicy(dense_every=64, dense_upto=130).checkpoints(300, 300, 0, 16) == \
        [64, 128, 288]
    assert pol.keep_pages([64, 288], 32, 16) == {2, 3, 16, 17}


def test_named_policies():
    assert POLICIES["prompt-only"].branch is False and POLICIES["prompt-only"].output is False
    assert POLICIES["hybrid"].output is False and POLICIES["hybrid-output"].output is True
    assert POLICIES["hybrid"].dense_every and POLICIES["hybrid"].branch
    assert POLICIES["keep-all"].keep_all


def make_tree():
    P, W = 4, 8
    fa, sa = PageAllocator(64), PageAllocator(64)
    tree = RadixTree(P, W, fa, sa, RetentionPolicy(dense_every=16))
    toks = list(range(40))
    # Checkpoints 16, 32 (dense), 36 (prompt end: 39 rounded down) and 40 (end): nodes are
    # split there; windows: 16 -> pages 2, 3; 32 -> 6, 7; 36 -> 7, 8; 40 -> 8, 9.
    assert tree.keep_pages(40, 40, 0) == {2, 3, 6, 7, 8, 9}
    res = tree.insert(toks, fa.alloc(10), sa.alloc(10), prompt_len=40)
    assert res.dup_full == [] and len(res.dup_swa) == 4
    sa.free(res.dup_swa)
    tree.check_integrity()
    return tree, toks


def test_tree_gives_speculative_windows_the_lowest_priority():
    tree, toks = make_tree()
    # Only the node ending at 16 holds nothing but a dense window (page 7, in the node
    # ending at 32, is also the prompt checkpoint's).
    assert sorted(n.end for n in tree.paths.nodes() if n.swa_time < 0) == [16]
    assert all(tree.owns_swa(s) for n in tree.paths.nodes() for s in n.swa if s >= 0)
    assert tree.evict(0, 1) == (0, 2)           # the speculative window goes first
    tree.check_integrity()
    assert tree.match(toks).length == 40 and tree.match(toks[:16]).length == 0
    assert tree.match(toks[:32]).length == 32 and tree.match(toks[:37]).length == 36


def test_a_match_promotes_a_speculative_window():
    tree, toks = make_tree()
    assert tree.match(toks[:16]).length == 16   # used: now as young as any firm window
    assert tree.match(toks).length == 40
    assert tree.evict(0, 1) == (0, 2)           # the oldest is the window at 32 now
    assert tree.match(toks[:16]).length == 16 and tree.match(toks[:32]).length == 16
    assert SPECULATIVE > 2**32


def test_an_extended_end_is_demoted():
    tree, toks = make_tree()
    fa, sa = tree.full_alloc, tree.swa_alloc
    m = tree.match(toks)
    tree.lock(m.node)
    more = toks + list(range(100, 108))         # the next turn: 8 more tokens
    res = tree.insert(more, m.full_pages + fa.alloc(2), list(m.swa_pages) + sa.alloc(2),
                      prompt_len=48)
    fa.free(res.dup_full)
    sa.free(res.dup_swa)
    tree.unlock(m.node)
    tree.check_integrity()
    old_end = [n for n in tree.paths.nodes() if n.end == 40]
    assert len(old_end) == 1 and old_end[0].swa_time < 0 and old_end[0].children


@pytest.mark.parametrize("revive", [True, False], ids=["finish", "sync"])
def test_spare_pages_are_kept_speculative_beside_firm_windows(revive):
    """`spare`: every live SWA page offered is kept, those outside the checkpoints' windows
    in nodes of their own at speculative priority, so SWA pressure takes them first and the
    firm windows stay. Without it the same insert hands them back."""
    P, W = 4, 8
    toks = list(range(40))
    plain = RadixTree(P, W, PageAllocator(64), PageAllocator(64), RetentionPolicy())
    res = plain.insert(toks, plain.full_alloc.alloc(10), plain.swa_alloc.alloc(10),
                       prompt_len=40, revive=revive)
    assert len(res.dup_swa) == 7                # pages 0-6: outside the windows of 36 and 40
    fa, sa = PageAllocator(64), PageAllocator(64)
    tree = RadixTree(P, W, fa, sa, RetentionPolicy(spare=True))
    res = tree.insert(toks, fa.alloc(10), sa.alloc(10), prompt_len=40, revive=revive)
    assert res.dup_full == [] and res.dup_swa == []
    tree.check_integrity()
    # windows of 36 (pages 7, 8) and 40 (8, 9) are firm; pages 0-6 a node of their own
    assert sorted(n.end for n in tree.paths.nodes() if n.swa_time < 0) == [28]
    assert all(s >= 0 for n in tree.paths.nodes() for s in n.swa or [])
    assert sa.num_free + sa.num_evictable + sa.num_in_use == sa.capacity
    # (before any match: one ending in the spare node would promote it)
    assert tree.evict(0, 1) == (0, 7)           # the spare node's SWA goes first, whole
    tree.check_integrity()
    assert tree.match(toks[:20]).length == 0 and tree.match(toks).length == 40
    assert tree.match(toks[:37]).length == 36
    # kept, a fork anywhere is window-safe: the same insert again, then a match at 20
    again = RadixTree(P, W, PageAllocator(64), PageAllocator(64), RetentionPolicy(spare=True))
    again.insert(toks, again.full_alloc.alloc(10), again.swa_alloc.alloc(10), prompt_len=40,
                 revive=revive)
    assert [again.match(toks[:k]).length for k in (13, 20, 40)] == [12, 20, 40]


def test_a_window_on_spare_pages_is_split_off_and_claimed():
    """A later insert whose checkpoint window lands on pages an earlier one kept as spare
    (a fork inside that prefill's chunk) splits them into a node of their own, claims them
    (no longer spare: the tiers copy them down) and gives that node a firm priority; the
    rest of the spare node stays spare and speculative."""
    P, W = 4, 8
    fa, sa = PageAllocator(64), PageAllocator(64)
    tree = RadixTree(P, W, fa, sa, RetentionPolicy(spare=True))
    toks = list(range(40))
    tree.insert(toks, fa.alloc(10), sa.alloc(10), prompt_len=40)
    spare_node = next(n for n in tree.paths.nodes() if n.end == 28)
    assert all(tree.spare_swa(s) for s in spare_node.swa)
    fork = toks[:20] + list(range(100, 112))          # branches at 20: window pages 3, 4
    m = tree.match(fork, count=False)
    assert m.length == 20
    tree.lock(m.node)
    res = tree.insert(fork, m.full_pages + fa.alloc(3), list(m.swa_pages) + sa.alloc(3),
                      prompt_len=len(fork))
    fa.free(res.dup_full)
    sa.free(res.dup_swa)
    tree.unlock(m.node)
    tree.check_integrity()
    ends = {n.end: n for n in tree.paths.nodes() if n.parent is not None and n.start < 28}
    win = next(n for n in ends.values() if n.start == 12 and n.end == 20)
    assert not any(tree.spare_swa(s) for s in win.swa) and win.swa_time > 0
    rest = [n for n in ends.values() if n is not win and n.end <= 28]
    assert rest and all(tree.spare_swa(s) for n in rest for s in n.swa if s >= 0)
    assert all(n.swa_time < 0 for n in rest)
