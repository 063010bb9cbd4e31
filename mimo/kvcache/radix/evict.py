"""Eviction, leaf trimming and the integrity check of the SWA-aware radix tree.

Two LRU orders, kept as lazy heaps (an entry is stale once its node died or its time moved;
stale entries are skipped when they reach the top):
- whole nodes, by `time` (last use as a prefix): only unlocked leaves are candidates, so
  a path is evicted from its end towards the root;
- SWA segments, by `swa_time` (last match that *ended* in the node, or last write): a node's
  SWA pages outside every lock and every leaf's tail window are tombstoned, its full KV kept.
  A node on the path of every request (a system prompt) stays young in the node order while
  its checkpoint, which only requests stopping there use, can age in the SWA order.
When the SWA pool needs pages, whichever candidate is older goes first (speculative windows,
see `tree.py`, are older than anything else).

With window rebuild (`RadixTree.rebuild` > 0) a window freed alone costs at most a receptive
field of recomputation, while a leaf dropped for its SWA loses all of its full KV. So the
tail window of a leaf at least a receptive field long is not protected: it sits in the SWA
order like any other window, the leaf keeps its full KV, and a later match rebuilds it. SWA
pressure then drops a whole leaf only for an older protected (shorter) one. This keeps the
cache useful when the SWA pool is sized for running requests' windows (the server's default
split) rather than for the cache (docs/kvcache_measurements.md has the hit rates).

Freeing goes through unpark + free so the allocator sees EVICTABLE -> IN_USE -> FREE and
raises on any page freed twice.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from ..pool.allocator import EVICTABLE, IN_USE
from .node import EVICTED_SWA, TreeCore
from .retention import window_first_page


class EvictMixin(TreeCore):
    if TYPE_CHECKING:
        # RadixTree's (the match rules own where a rebuild starts).
        def _rebuild_start(self, end: int, rebuild: int) -> int: ...

    # ---- public ------------------------------------------------------------------------
    def evict(self, full: int = 0, swa: int = 0) -> tuple[int, int]:
        """Free at least `full` full pages and `swa` SWA pages, fewer only when everything
        left is locked. Returns (full pages freed, SWA pages freed)."""
        ff, fs = self._evict(full, swa)
        if (ff < full and self.full_alloc.num_evictable) or (
                fs < swa and self.hybrid and self._swa_pool.num_evictable):
            # Evictable pages the lazy heaps lost track of. Never expected (`reheaps`
            # counts it; the property tests assert 0), but the scheduler counts every
            # evictable page as available, so rebuild both heaps and go on.
            self.counters["reheaps"] += 1
            self._reheap()
            a, b = self._evict(full - ff, swa - fs)
            ff, fs = ff + a, fs + b
        return ff, fs

    def _reheap(self) -> None:
        self._leaf_heap, self._swa_heap = [], []
        for n in self._nodes():
            self._push_leaf(n)
            self._push_swa(n)

    def _evict(self, full: int, swa: int) -> tuple[int, int]:
        self._compact()
        ff = fs = 0
        while ff < full:
            leaf = self._top(self._leaf_heap, self._leaf_ok)
            if leaf is None:
                break
            a, b = self._evict_leaf(leaf)
            ff, fs = ff + a, fs + b
        while fs < swa and self.hybrid:
            leaf = self._top(self._leaf_heap, self._leaf_ok)
            node = self._top(self._swa_heap, self._swa_ok)
            # (A leaf whose window is unprotected is in the SWA order itself.)
            if node is not None and (leaf is None or node.swa_time < leaf.time
                                     or not self._protects(leaf)):
                fs += self._evict_swa(node)
            elif leaf is not None:
                a, b = self._evict_leaf(leaf)
                ff, fs = ff + a, fs + b
            else:
                break
        return ff, fs

    # ---- heaps -------------------------------------------------------------------------
    @staticmethod
    def _top(heap, ok):
        while heap:
            t, _, node = heap[0]
            if ok(node, t):
                return node
            heapq.heappop(heap)
        return None

    def _leaf_ok(self, node, t) -> bool:
        return node.alive and node.time == t and not node.children and node.lock_ref == 0

    def _swa_ok(self, node, t) -> bool:
        return node.alive and node.swa_time == t and bool(self._freeable(node))

    def _compact(self) -> None:
        """Drop stale entries (every time update pushes a new one); amortized O(1)."""
        if len(self._leaf_heap) + len(self._swa_heap) <= self._heap_cap:
            return
        for name, key in (("_leaf_heap", "time"), ("_swa_heap", "swa_time")):
            h = [e for e in getattr(self, name) if e[2].alive and getattr(e[2], key) == e[0]]
            heapq.heapify(h)
            setattr(self, name, h)
        self._heap_cap = max(65536, 2 * (len(self._leaf_heap) + len(self._swa_heap)))

    # ---- SWA-only eviction ----------------------------------------------------------------
    def _min_leaf_end(self, node) -> int:
        """Smallest leaf end in node's subtree among those whose tail window can reach back
        into node (ends before node.end + W - 1); larger ends protect nothing here. Nor does
        a leaf whose window `_protects` says may go."""
        limit = node.end + self.W - 1
        if not node.children:
            return node.end if self._protects(node) else limit
        best = None
        stack = list(node.children.values())
        while stack:
            c = stack.pop()
            if not c.children:
                if self._protects(c):
                    best = c.end if best is None else min(best, c.end)
            elif c.end < limit:
                stack.extend(c.children.values())
        return best if best is not None else limit

    def _protects(self, leaf) -> bool:
        """Whether SWA-only eviction must keep the leaf's tail window beyond its SWA locks.
        A locked leaf's window is locked page by page (`lock`) where its requests read it;
        under a rebuild lock they recompute it, and pages they moved past (`unpin`) they
        no longer read: nothing more to keep. An unlocked leaf's window is kept unless a
        rebuild would replace it: a rebuild from
        the leaf's end starts after 0 and no window-safe point lies between its start and
        the end (else a match would stop there and the leaf's tail past it would be dead
        weight)."""
        if leaf.lock_ref:
            return False
        if not self._rebuild_reaches(leaf):
            return True
        r = self._rebuild_start(leaf.end, self.rebuild)
        live = self._path_live(leaf, window_first_page(r * self.P, self.W, self.P))
        return self._safe_pages(live, leaf.end // self.P - 1, lo=r - 1) >= r    # in [r, e)

    def _rebuild_reaches(self, leaf) -> bool:
        """A match ending at the leaf's end can rebuild its window (the start is after 0):
        such a leaf may end where its window is gone."""
        return self.rebuild > 0 and self._rebuild_start(leaf.end, self.rebuild) > 0

    def _freeable(self, node) -> list[int]:
        """Local indices of live SWA pages that no lock and no leaf's tail window needs."""
        if not node.swa or node.parent is None:
            return []
        first = window_first_page(self._min_leaf_end(node), self.W, self.P) - node.start // self.P
        upto = min(len(node.swa), max(first, 0))
        return [i for i in range(upto) if node.swa[i] >= 0 and i not in node.swa_lock]

    def _evict_swa(self, node) -> int:
        idx = self._freeable(node)
        if self.on_evict is not None and idx:
            self.on_evict(node, [], idx)
        pages = [node.swa[i] for i in idx]
        if self.unmap is not None:
            self.unmap([node.full[i] for i in idx])
        for i in idx:
            node.swa[i] = EVICTED_SWA
        self._own_s[pages] = False
        self._swa_pool.unpark(pages)
        self._swa_pool.free(pages)
        self.counters["tombstoned_swa"] += len(pages)
        if self.rebuild:
            self._push_unprotected(node)
        return len(pages)

    def _push_unprotected(self, node) -> None:
        """Tombstoning SWA in `node` may leave a leaf below it with no window-safe point in
        its last receptive field, so its window turns freeable (`_protects`) while the nodes
        holding that window may have left the SWA heap (an entry that was not freeable when
        it reached the top was dropped): push them again. Extra pushes are harmless."""
        limit = node.end + self.rebuild + self.W + 4 * self.P   # past every such leaf's start
        stack = [node]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(c for c in n.children.values() if c.start < limit)
            else:
                self._push_window(n)

    def _push_window(self, leaf) -> None:
        """Put the nodes holding the leaf's tail window back in the SWA heap."""
        for m in {id(m): m for m, _ in self._window(leaf)}.values():
            self._push_swa(m)

    # ---- whole-node eviction ---------------------------------------------------------------
    def _drop(self, node) -> tuple[int, int]:
        """Unlink an unlocked leaf and free all its pages."""
        assert node.lock_ref == 0 and not node.children and not node.swa_lock
        if self.on_evict is not None:
            self.on_evict(node, list(range(len(node.full))),
                          [i for i, s in enumerate(node.swa or ()) if s >= 0])
        del node.parent.children[tuple(node.tokens[:self.P])]
        node.alive = False
        self._own_f[node.full] = False
        self.full_alloc.unpark(node.full)
        self.full_alloc.free(node.full)
        live = [i for i, s in enumerate(node.swa or ()) if s >= 0]
        if live:
            if self.unmap is not None:
                self.unmap([node.full[i] for i in live])
            pages = [node.swa[i] for i in live]
            self._own_s[pages] = False
            self._swa_pool.unpark(pages)
            self._swa_pool.free(pages)
        self.counters["evicted_full"] += len(node.full)
        self.counters["evicted_swa"] += len(live)
        return len(node.full), len(live)

    def _evict_leaf(self, leaf) -> tuple[int, int]:
        ff, fs = self._drop(leaf)
        parent = leaf.parent
        # Ancestors whose pages sat in the dropped leaf's tail window may be freeable now.
        n = parent
        while n.parent is not None and n.end > leaf.end - self.W:
            self._push_swa(n)
            n = n.parent
        if parent.parent is not None and not parent.children:
            a, b = self._fix_leaf(parent)
            ff, fs = ff + a, fs + b
        return ff, fs

    def _fix_leaf(self, node) -> tuple[int, int]:
        """Restore "every leaf ends window-safe" for a node that just became a leaf: cut it
        back to its last safe point, or drop it and repeat with its parent. (Even where a
        rebuild could reach past that point: its subtree just aged out, and keeping the
        tail for a rebuild did worse on a real trace: docs/kvcache_measurements.md.)"""
        P, ff, fs = self.P, 0, 0
        while node.parent is not None and not node.children:
            if node.lock_ref:
                break               # a locked leaf is a match node: unlock fixes it
            if not self.hybrid:
                break
            s, e = node.start // P, node.end // P
            live = self._path_live(node, window_first_page(node.start + P, self.W, P))
            q = self._safe_pages(live, e, lo=s)
            if q == e:
                break
            if q > s:
                pre = self._split(node, q - s)
                a, b = self._drop(node)
                ff, fs, node = ff + a, fs + b, pre
                break
            parent = node.parent
            a, b = self._drop(node)
            ff, fs, node = ff + a, fs + b, parent
        self._push_leaf(node)
        if self.rebuild:            # as a leaf, its own window may be freeable (`_protects`)
            self._push_window(node)
        return ff, fs

    # ---- checks ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        P, fs_state = self.P, self.full_alloc._state
        seen_f, seen_s, evict_f, evict_s = set(), set(), 0, 0
        for root in self._roots.values():
            assert root.parent is None and not root.full and root.end == 0
            for c in root.children.values():
                assert c.parent is root
        for n in self._nodes():
            p = n.parent
            assert n.alive and p.children.get(tuple(n.tokens[:P])) is n, "broken link"
            assert n.start == p.end and len(n.full) > 0 and len(n.tokens) == len(n.full) * P
            assert n.lock_ref >= 0 and (p.parent is None or p.lock_ref >= n.lock_ref)
            for pg in n.full:
                assert pg not in seen_f, f"full page {pg} held twice"
                seen_f.add(pg)
                want = IN_USE if n.lock_ref else EVICTABLE
                assert fs_state[pg] == want, f"full page {pg} state {fs_state[pg]} != {want}"
                evict_f += want == EVICTABLE
            if not self.hybrid:
                assert n.swa is None and not n.swa_lock
                continue
            assert len(n.swa) == len(n.full)
            for i, c in n.swa_lock.items():
                assert c > 0 and n.swa[i] >= 0 and n.lock_ref > 0, "SWA lock on a dead page"
            for i, sp in enumerate(n.swa):
                if sp < 0:
                    continue
                assert sp not in seen_s, f"SWA page {sp} held twice"
                seen_s.add(sp)
                want = IN_USE if i in n.swa_lock else EVICTABLE
                assert self._swa_pool._state[sp] == want, f"SWA page {sp} in wrong state"
                evict_s += want == EVICTABLE
            if not n.children and not n.lock_ref and not self._rebuild_reaches(n):
                # (A locked leaf's window is live where a window lock pins it; a rebuild
                # lock's request recomputes it and a request past it (`unpin`) no longer
                # reads it: unlock fixes the leaf if it must. A leaf a rebuild can reach
                # may have lost its window.)
                assert all(m.swa[i] >= 0 for m, i in self._window(n)), \
                    f"leaf ending at {n.end} is not window-safe (tombstoned tail)"
        assert int(self._own_f.sum()) == len(seen_f) and all(self._own_f[list(seen_f)])
        assert int(self._own_s.sum()) == len(seen_s) and all(self._own_s[list(seen_s)])
        assert self.full_alloc.num_evictable == evict_f, "full pages parked outside the tree"
        self.full_alloc.check_integrity()
        if self.swa_alloc is not None:
            assert self.swa_alloc.num_evictable == evict_s, "SWA pages parked outside the tree"
            self.swa_alloc.check_integrity()

    def stats(self) -> dict:
        nodes = list(self._nodes())
        swa = [s for n in nodes for s in (n.swa or ())]
        out = {"mode": self.mode, "nodes": len(nodes),
               "cached_tokens": sum(len(n.tokens) for n in nodes),
               "full_pages": sum(len(n.full) for n in nodes),
               "swa_live_pages": sum(s >= 0 for s in swa),
               "swa_tombstones": sum(s < 0 for s in swa),
               "locked_nodes": sum(n.lock_ref > 0 for n in nodes),
               "full_pool": self.full_alloc.stats()}
        if self.swa_alloc is not None:
            out["swa_pool"] = self.swa_alloc.stats()
        out.update(self.counters)
        return out
