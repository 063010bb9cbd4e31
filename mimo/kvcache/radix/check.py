"""The radix tree's invariants (listed in tree.py), asserted node by node and page by page:
what the property tests and the engine fuzzer call after every step."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..pool.allocator import EVICTABLE, IN_USE

if TYPE_CHECKING:
    from .tree import RadixTree


def check_integrity(tree: RadixTree) -> None:
    P, paths, evictor = tree.P, tree.paths, tree.evictor
    fs_state = tree.full_alloc._state
    seen_f: set[int] = set()
    seen_s: set[int] = set()
    evict_f = evict_s = 0
    for root in paths.roots.values():
        assert root.parent is None and not root.full and root.end == 0
        for child in root.children.values():
            assert child.parent is root
    for n in paths.nodes():
        p = n.parent
        assert p is not None
        assert n.alive and p.children.get(tuple(n.tokens[:P])) is n, "broken link"
        assert n.start == p.end and len(n.full) > 0 and len(n.tokens) == len(n.full) * P
        assert n.lock_ref >= 0 and (p.parent is None or p.lock_ref >= n.lock_ref)
        for pg in n.full:
            assert pg not in seen_f, f"full page {pg} held twice"
            seen_f.add(pg)
            want = IN_USE if n.lock_ref else EVICTABLE
            assert fs_state[pg] == want, f"full page {pg} state {fs_state[pg]} != {want}"
            evict_f += want == EVICTABLE
        if not tree.hybrid:
            assert n.swa is None and not n.swa_lock
            continue
        assert n.swa is not None and len(n.swa) == len(n.full)
        for i, c in n.swa_lock.items():
            assert c > 0 and n.swa[i] >= 0 and n.lock_ref > 0, "SWA lock on a dead page"
        for i, sp in enumerate(n.swa):
            if sp < 0:
                continue
            assert sp not in seen_s, f"SWA page {sp} held twice"
            seen_s.add(sp)
            want = IN_USE if i in n.swa_lock else EVICTABLE
            assert tree.pages.swa_pool._state[sp] == want, f"SWA page {sp} in wrong state"
            evict_s += want == EVICTABLE
        if not n.children and not n.lock_ref and not evictor.rebuild_reaches(n):
            # (A locked leaf's window is live where a window lock pins it; a rebuild
            # lock's request recomputes it and a request past it (`unpin`) no longer
            # reads it: unlock fixes the leaf if it must. A leaf a rebuild can reach
            # may have lost its window.)
            assert all(m.swa is not None and m.swa[i] >= 0 for m, i in paths.window(n)), \
                f"leaf ending at {n.end} is not window-safe (tombstoned tail)"
    for node, tail in tree.tails.items():
        # A tail: a live node's, 1 .. P - 1 tokens, pages parked and held once.
        assert node.alive and node.parent is not None, "a tail of a root or a dropped node"
        assert node.parent.children.get(tuple(node.tokens[:P])) is node, "a tail's broken link"
        assert 0 < len(tail.tokens) < P and (tail.swa is not None) == tree.hybrid
        assert tail.full not in seen_f and fs_state[tail.full] == EVICTABLE, "tail's full page"
        seen_f.add(tail.full)
        evict_f += 1
        if tail.swa is not None:
            assert tail.swa not in seen_s, f"SWA page {tail.swa} held twice"
            assert tree.pages.swa_pool._state[tail.swa] == EVICTABLE, "tail's SWA page"
            seen_s.add(tail.swa)
            evict_s += 1
    own_f, own_s = tree.pages.own_f, tree.pages.own_s
    assert int(own_f.sum()) == len(seen_f) and all(own_f[list(seen_f)])
    assert int(own_s.sum()) == len(seen_s) and all(own_s[list(seen_s)])
    assert not (tree.pages.spare_s & ~own_s).any(), "a spare mark on an SWA page not held"
    assert tree.full_alloc.num_evictable == evict_f, "full pages parked outside the tree"
    tree.full_alloc.check_integrity()
    if tree.swa_alloc is not None:
        assert tree.swa_alloc.num_evictable == evict_s, "SWA pages parked outside the tree"
        tree.swa_alloc.check_integrity()
