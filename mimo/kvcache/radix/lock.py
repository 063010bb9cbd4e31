"""Locks of the SWA-aware radix tree (the invariants are in tree.py): a running request
keeps the full KV of its cached path and the SWA window before its end from eviction, and
lets go of that window page by page as its decoding moves past it (`unpin`)."""
from __future__ import annotations

from .evict import Evictor
from .lru import LRU
from .node import Node
from .pages import PageBook
from .paths import Paths


class LockTable:
    def __init__(self, paths: Paths, lru: LRU, pages: PageBook, evictor: Evictor) -> None:
        self.paths, self.lru, self.pages, self.evictor = paths, lru, pages, evictor
        self.P, self.hybrid = paths.P, paths.hybrid

    def lock(self, node: Node | None, window: bool = True) -> None:
        """Keep the full KV of root..node and the SWA window before node.end (the pages a
        request admitted with this match reads) from eviction. `window=False`: the full KV
        only (a rebuild match, whose window is what the request recomputes); unlock the
        same way."""
        if node is None or node.parent is None:
            return
        n = node
        while n.parent is not None:
            n.lock_ref += 1
            if n.lock_ref == 1:
                self.pages.full_alloc.unpark(n.full)
            n = n.parent
        for n, i in (self.paths.window(node) if self.hybrid and window else ()):
            assert n.swa is not None and n.swa[i] >= 0, "locking a window that is not live"
            c = n.swa_lock.get(i, 0)
            n.swa_lock[i] = c + 1
            if c == 0:
                self.pages.swa_pool.unpark([n.swa[i]])

    def window_of(self, node: Node | None) -> list[tuple[int, int]]:
        """(logical page, SWA page) of the window a window lock on `node` pins."""
        if node is None or node.parent is None or not self.hybrid:
            return []
        return [(n.start // self.P + i, n.swa[i]) for n, i in self.paths.window(node)
                if n.swa is not None]

    def unpin(self, node: Node | None, lo: int, hi: int) -> None:
        """Drop a window lock's pins on the window pages of `node` at logical pages
        [lo, hi) (its request has moved past them and no longer reads them); the full
        lock and the rest of the window stay. Unlock it later with `unpinned=hi`."""
        if node is None or node.parent is None or not self.hybrid:
            return
        for n, i in self.paths.window(node):
            if lo <= n.start // self.P + i < hi:
                self._unpin_page(n, i)

    def _unpin_page(self, n: Node, i: int) -> None:
        assert n.swa is not None            # SWA locks exist in hybrid mode only
        c = n.swa_lock[i] - 1
        if c:
            n.swa_lock[i] = c
        else:
            del n.swa_lock[i]
            self.pages.swa_pool.park([n.swa[i]])
            self.lru.push_swa(n)

    def unlock(self, node: Node | None, window: bool = True, fix: bool = True,
               unpinned: int = 0) -> None:
        """Undo `lock`. `fix=False`: leave a rebuild-locked leaf untrimmed (the match is
        being handed back unused, so its leaf is exactly as the match found it).
        `unpinned`: the logical page below which `unpin` already let go of the window."""
        if node is None or node.parent is None:
            return
        for n, i in (self.paths.window(node) if self.hybrid and window else ()):
            if n.start // self.P + i >= unpinned:
                self._unpin_page(n, i)
        n = node
        while n.parent is not None:
            n.lock_ref -= 1
            assert n.lock_ref >= 0, "unlock without lock"
            if n.lock_ref == 0:
                self.pages.full_alloc.park(n.full)
                self.lru.push_leaf(n)
            n = n.parent
        if (fix and (not window or unpinned) and self.hybrid and node.alive
                and not node.children and not node.lock_ref):
            # A rebuild lock, or a window lock that let go of its window, may have kept a
            # leaf whose window is gone (SWA eviction, and the request did not extend the
            # leaf): cut it back to safety.
            self.evictor.fix_leaf(node)
