"""Eviction and leaf trimming of the SWA-aware radix tree.

Two LRU orders (lru.py): whole nodes by last use as a prefix, only unlocked leaves being
candidates, and SWA segments by last match that ended in the node: a node's SWA pages outside
every lock and every leaf's tail window are tombstoned, its full KV kept. A node on the path
of every request (a system prompt) stays young in the node order while its checkpoint, which
only requests stopping there use, can age in the SWA order. When the SWA pool needs pages,
whichever candidate is older goes first (speculative windows, see `tree.py`, are older than
anything else). Before any of them go the nodes' tails, the partial last pages kept for
copying (tails.py), least recently used first.

With window rebuild (`rebuild` > 0) a window freed alone costs at most a receptive field of
recomputation, while a leaf dropped for its SWA loses all of its full KV. So the tail window
of a leaf at least a receptive field long is not protected: it sits in the SWA order like any
other window, the leaf keeps its full KV, and a later match rebuilds it. SWA pressure then
drops a whole leaf only for an older protected (shorter) one. This keeps the cache useful
when the SWA pool is sized for running requests' windows (the server's default split) rather
than for the cache (docs/kvcache_measurements.md has the hit rates).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from .lru import LRU
from .node import EVICTED_SWA, Node
from .pages import PageBook
from .paths import Paths
from .retention import window_first_page
from .tails import TailBook

EvictHook = Callable[[Node, list[int], list[int]], None]


class TreeListener(Protocol):
    """Told what enters and leaves the tree, on the thread that changes it."""
    def inserted(self, tokens: Sequence[int], namespace: Hashable) -> None:
        """After an insert: the path equal to `tokens` holds what it will serve now."""

    def evicted(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        """Just before eviction frees these local pages of `node` (its keys still valid)."""


class Evictor:
    def __init__(self, paths: Paths, lru: LRU, pages: PageBook, counters: dict[str, int],
                 rebuild: int, unmap: Callable[[list[int]], None] | None,
                 tails: TailBook) -> None:
        self.paths, self.lru, self.pages, self.counters = paths, lru, pages, counters
        self.tails = tails      # nodes' partial last pages: evicted first, dropped with them
        self.P, self.W, self.hybrid, self.rebuild = paths.P, paths.W, paths.hybrid, rebuild
        self.unmap = unmap      # told which full pages lost their SWA (DualPool.full_to_swa)
        # Called with (node, local full pages, local SWA pages) just before eviction frees
        # them, while their KV is still intact: a lower tier copies them down (write-back).
        self.slot: EvictHook | None = None
        # Observers of what the tree holds beside that slot (the router's cache publishing,
        # engine/cache_mirror.py): told of every insert and, after the slot, every eviction.
        self.listeners: list[TreeListener] = []

    @property
    def on_evict(self) -> EvictHook | None:
        return self._fan_out if self.listeners else self.slot

    def _fan_out(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        if self.slot is not None:
            self.slot(node, full_idx, swa_idx)
        for li in self.listeners:
            li.evicted(node, full_idx, swa_idx)

    def evict(self, full: int = 0, swa: int = 0) -> tuple[int, int]:
        """Free at least `full` full pages and `swa` SWA pages, fewer only when everything
        left is locked. Returns (full pages freed, SWA pages freed)."""
        ff, fs = self._evict(full, swa)
        if (ff < full and self.pages.full_alloc.num_evictable) or (
                fs < swa and self.hybrid and self.pages.swa_pool.num_evictable):
            # Evictable pages the lazy heaps lost track of. Never expected (`reheaps`
            # counts it; the property tests assert 0), but the scheduler counts every
            # evictable page as available, so rebuild both heaps and go on.
            self.counters["reheaps"] += 1
            self.lru.rebuild(self.paths.nodes())
            a, b = self._evict(full - ff, swa - fs)
            ff, fs = ff + a, fs + b
        return ff, fs

    def _evict(self, full: int, swa: int) -> tuple[int, int]:
        self.lru.compact()
        ff, fs = self.tails.evict(full, swa)
        while ff < full:
            leaf = self.lru.top_leaf()
            if leaf is None:
                break
            a, b = self._evict_leaf(leaf)
            ff, fs = ff + a, fs + b
        while fs < swa and self.hybrid:
            leaf = self.lru.top_leaf()
            node = self.lru.top_swa(lambda n: bool(self.freeable(n)))
            # (A leaf whose window is unprotected is in the SWA order itself.)
            if node is not None and (leaf is None or node.swa_time < leaf.time
                                     or not self.protects(leaf)):
                fs += self._evict_swa(node)
            elif leaf is not None:
                a, b = self._evict_leaf(leaf)
                ff, fs = ff + a, fs + b
            else:
                break
        return ff, fs

    # ---- which SWA may go ------------------------------------------------------------------
    def _min_leaf_end(self, node: Node) -> int:
        """Smallest leaf end in node's subtree among those whose tail window can reach back
        into node (ends before node.end + W - 1); larger ends protect nothing here. Nor does
        a leaf whose window `protects` says may go."""
        limit = node.end + self.W - 1
        if not node.children:
            return node.end if self.protects(node) else limit
        best = None
        stack = list(node.children.values())
        while stack:
            c = stack.pop()
            if not c.children:
                if self.protects(c):
                    best = c.end if best is None else min(best, c.end)
            elif c.end < limit:
                stack.extend(c.children.values())
        return best if best is not None else limit

    def protects(self, leaf: Node) -> bool:
        """Whether SWA-only eviction must keep the leaf's tail window beyond its SWA locks.
        A locked leaf's window is locked page by page (`lock`) where its requests read it;
        under a rebuild lock they recompute it, and pages they moved past (`unpin`) they
        no longer read: nothing more to keep. An unlocked leaf's window is kept unless a
        rebuild would replace it: a rebuild from the leaf's end starts after 0 and no
        window-safe point lies between its start and the end (else a match would stop
        there and the leaf's tail past it would be dead weight)."""
        if leaf.lock_ref:
            return False
        if not self.rebuild_reaches(leaf):
            return True
        r = self.paths.rebuild_start(leaf.end, self.rebuild)
        live = self.paths.path_live(leaf, window_first_page(r * self.P, self.W, self.P))
        return self.paths.safe_pages(live, leaf.end // self.P - 1, lo=r - 1) >= r  # in [r, e)

    def rebuild_reaches(self, leaf: Node) -> bool:
        """A match ending at the leaf's end can rebuild its window (the start is after 0):
        such a leaf may end where its window is gone."""
        return self.rebuild > 0 and self.paths.rebuild_start(leaf.end, self.rebuild) > 0

    def freeable(self, node: Node) -> list[int]:
        """Local indices of live SWA pages that no lock and no leaf's tail window needs."""
        if not node.swa or node.parent is None:
            return []
        first = window_first_page(self._min_leaf_end(node), self.W, self.P) - node.start // self.P
        upto = min(len(node.swa), max(first, 0))
        return [i for i in range(upto) if node.swa[i] >= 0 and i not in node.swa_lock]

    # ---- SWA-only eviction -------------------------------------------------------------------
    def _evict_swa(self, node: Node) -> int:
        idx = self.freeable(node)
        if self.on_evict is not None and idx:
            self.on_evict(node, [], idx)
        assert node.swa is not None         # freeable: a node with SWA
        pages = [node.swa[i] for i in idx]
        if self.unmap is not None:
            self.unmap([node.full[i] for i in idx])
        for i in idx:
            node.swa[i] = EVICTED_SWA
        self.pages.free_swa(pages)
        self.counters["tombstoned_swa"] += len(pages)
        if self.rebuild:
            self._push_unprotected(node)
        return len(pages)

    def _push_unprotected(self, node: Node) -> None:
        """Tombstoning SWA in `node` may leave a leaf below it with no window-safe point in
        its last receptive field, so its window turns freeable (`protects`) while the nodes
        holding that window may have left the SWA heap (an entry that was not freeable when
        it reached the top was dropped): push them again. Extra pushes are harmless."""
        limit = node.end + self.rebuild + self.W + 4 * self.P   # past every such leaf's start
        stack = [node]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(c for c in n.children.values() if c.start < limit)
            else:
                self.push_window(n)

    def push_window(self, leaf: Node) -> None:
        """Put the nodes holding the leaf's tail window back in the SWA heap."""
        for m in {id(m): m for m, _ in self.paths.window(leaf)}.values():
            self.lru.push_swa(m)

    # ---- whole-node eviction ---------------------------------------------------------------
    def _drop(self, node: Node) -> tuple[int, int]:
        """Unlink an unlocked leaf and free all its pages."""
        assert node.lock_ref == 0 and not node.children and not node.swa_lock
        assert node.parent is not None
        if self.on_evict is not None:
            self.on_evict(node, list(range(len(node.full))),
                          [i for i, s in enumerate(node.swa or ()) if s >= 0])
        del node.parent.children[tuple(node.tokens[:self.P])]
        node.alive = False
        tf, ts = self.tails.drop(node)
        self.pages.free_full(node.full)
        live = [i for i, s in enumerate(node.swa or ()) if s >= 0]
        if live:
            assert node.swa is not None
            if self.unmap is not None:
                self.unmap([node.full[i] for i in live])
            self.pages.free_swa([node.swa[i] for i in live])
        self.counters["evicted_full"] += len(node.full)
        self.counters["evicted_swa"] += len(live)
        return len(node.full) + tf, len(live) + ts

    def _evict_leaf(self, leaf: Node) -> tuple[int, int]:
        ff, fs = self._drop(leaf)
        parent = leaf.parent
        assert parent is not None
        # Ancestors whose pages sat in the dropped leaf's tail window may be freeable now.
        n = parent
        while n.parent is not None and n.end > leaf.end - self.W:
            self.lru.push_swa(n)
            n = n.parent
        if parent.parent is not None and not parent.children:
            a, b = self.fix_leaf(parent)
            ff, fs = ff + a, fs + b
        return ff, fs

    def fix_leaf(self, node: Node) -> tuple[int, int]:
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
            live = self.paths.path_live(node, window_first_page(node.start + P, self.W, P))
            q = self.paths.safe_pages(live, e, lo=s)
            if q == e:
                break
            if q > s:
                pre = self.paths.split(node, q - s)
                a, b = self._drop(node)
                ff, fs, node = ff + a, fs + b, pre
                break
            parent = node.parent
            assert parent is not None       # (the loop's condition)
            a, b = self._drop(node)
            ff, fs, node = ff + a, fs + b, parent
        self.lru.push_leaf(node)
        if self.rebuild:            # as a leaf, its own window may be freeable (`protects`)
            self.push_window(node)
        return ff, fs
