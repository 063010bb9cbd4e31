"""PrefixCache: the engine's side of the radix tree. Moves a request's pages between its
SeqKV and the tree, keeping every page owned exactly once.

Ownership: a page in `seq.full_pages` / `seq.swa_pages` is either the request's own (freed
by `DualPool.free_seq`) or the tree's (`tree.owns_*`), in which case the request holds a
lock on a node covering it and never frees it. A request re-inserts its KV after every
prefill chunk and every decode page (`sync`), moving its lock to the new node, so its lock
covers at most its current window of SWA; at the end (`finish`) whatever the tree did not
take is freed.
"""
from __future__ import annotations

from ..kvcache.dual_pool import DualPool, SeqKV
from .radix_tree import RadixTree
from .retention import POLICIES, RetentionPolicy


class PrefixCache:
    def __init__(self, pool: DualPool, retention: str | RetentionPolicy = "hybrid-output"):
        policy = POLICIES[retention] if isinstance(retention, str) else retention
        self.pool = pool
        self.P = pool.page_size
        self.tree = RadixTree(pool.page_size, pool.window, pool.full.allocator,
                              pool.swa.allocator if pool.hybrid else None, policy,
                              mode="hybrid" if pool.hybrid else "full-kv",
                              unmap=pool.unmap_full_pages)
        pool.cache_attached = True
        pool.is_shared_full = self.owns_full
        pool.is_shared_swa = self.owns_swa

    def owns_full(self, page: int) -> bool:
        return self.tree.owns_full(page)

    def owns_swa(self, page: int) -> bool:
        return self.pool.hybrid and self.tree.owns_swa(page)

    # ---- admission -------------------------------------------------------------------
    def match(self, prompt_ids: list[int]):
        """Window-safe cached prefix of the prompt, all but its last token (which must be
        computed to produce logits). Not locked yet."""
        return self.tree.match(prompt_ids[:-1])

    def adopt(self, seq: SeqKV, m) -> int:
        """Point a new request's page tables at a match and lock it. Returns cached tokens."""
        self.tree.lock(m.node)
        seq.node = m.node
        seq.full_pages = list(m.full_pages)
        if self.pool.hybrid:
            seq.swa_pages = list(m.swa_pages)
            seq.swa_released = m.swa_first
        return m.length

    # ---- while running / at the end -----------------------------------------------------
    def sync(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """Insert the request's whole pages of KV so far and move its lock to them."""
        n = len(tokens) // self.P
        if n == 0:
            return
        swa = seq.swa_pages[:n] if self.pool.hybrid else None
        res = self.tree.insert(tokens[:n * self.P], seq.full_pages[:n], swa,
                               prompt_len=prompt_len)
        self._remap(res.remap)
        # Duplicates stay the request's own until it finishes (the KV is identical; keeping
        # them avoids re-pointing page tables mid-request).
        if res.cached_len:
            m = self.tree.match(tokens[:res.cached_len])
            if m.node is not seq.node:
                self.tree.lock(m.node)
                self.tree.unlock(seq.node)
                seq.node = m.node

    def finish(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """Offer the finished request's KV to the tree, then let go of everything."""
        n = len(tokens) // self.P
        if n:
            swa = seq.swa_pages[:n] if self.pool.hybrid else None
            res = self.tree.insert(tokens[:n * self.P], seq.full_pages[:n], swa,
                                   prompt_len=prompt_len)
            self._remap(res.remap)
        node, seq.node = seq.node, None
        self.pool.free_seq(seq)        # frees only pages the tree does not own
        self.tree.unlock(node)

    def _remap(self, pairs) -> None:
        for full_page, swa_page in pairs:
            self.pool.map_pages(full_page, swa_page)

    # ---- room ---------------------------------------------------------------------------
    def make_room(self, full: int, swa: int) -> None:
        """Evict unlocked cached pages until `full` / `swa` pages are free (or nothing
        evictable is left)."""
        need_f = max(0, full - self.pool.full.allocator.num_free)
        need_s = max(0, swa - self.pool.swa.allocator.num_free) if self.pool.hybrid else 0
        if need_f or need_s:
            self.tree.evict(need_f, need_s)

    def check_integrity(self) -> None:
        self.tree.check_integrity()
