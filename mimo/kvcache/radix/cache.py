"""RadixPrefixCache: the `PrefixCache` over the SWA-aware radix tree. Moves a request's
pages between its SeqKV and the tree, keeping every page owned exactly once.

Ownership: a page in `seq.full_pages` / `seq.swa_pages` is either the request's own (freed
by `DualPool.free_seq`) or the tree's (`tree.owns_*`), which the request never frees.

Invariant while a request runs: every tree page in its tables is covered by its lock, and
(between steps) its lock pins no page outside its tables. The request locks the node ending
at `E` (full KV of [0, E), SWA of the window before E); its tables hold tree pages only
below E, and tree SWA pages only inside that window (older ones are dropped from the table
by window release, which runs after each sync). When window release drops pages of the
lock's window from the table (decoding moved past them), `window_released` unpins them: the
request no longer reads them, and holding them would make the request hold more SWA pages
than its reservation (its live window) while it decodes. So the tree can evict anything else
at any time without pulling KV from under a running request, and everything a lock pins is
in a table the scheduler reserved.

A request inserts its KV after every prefill chunk (`sync`, up to where its window release
stands): the tree takes the new pages it wants (never reviving tombstones: a revived page
could sit beyond E), the request adopts the tree's copy of any tokens it recomputed, and
moves its lock to the new window-safe end. So the lock's full pages are the request's
table, and its window pages are too once `window_released` has let go of the ones the table
no longer holds (`pinned_outside`, which the scheduler adds to the reservation, counts
whatever is left: nothing after a step; the rule is stated in engine/scheduler.py). At the
end (`finish`) the
tree takes what it wants, reviving tombstones with pages the request recomputed, and the
rest is freed.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import cast

from ..pool.dual_pool import DualPool
from ..pool.seq_kv import SeqKV
from .node import Node
from .prefix_cache import COUNTERS, PrefixCache
from .retention import POLICIES, RetentionPolicy
from .tails import PartialPage
from .tree import RadixTree


def _locked(seq: SeqKV) -> Node | None:
    """The tree node seq's lock is on. SeqKV keeps its node opaque (any prefix cache's);
    every node this cache puts there is one of its tree's (`admit`, `sync`)."""
    return cast("Node | None", seq.node)


class RadixPrefixCache(PrefixCache):
    def __init__(self, pool: DualPool, retention: str | RetentionPolicy = "hybrid-output",
                 rebuild: bool = True):
        policy = POLICIES[retention] if isinstance(retention, str) else retention
        self.pool = pool
        self.P = pool.page_size
        # Window rebuild (RadixTree.match): the SWA receptive field in tokens, 0 when off.
        self.rebuild = pool.layout.swa_receptive_field if rebuild and pool.hybrid else 0
        self.tree = RadixTree(pool.page_size, pool.window, pool.full.allocator,
                              pool.swa.allocator if pool.hybrid else None, policy,
                              mode="hybrid" if pool.hybrid else "full-kv",
                              unmap=pool.unmap_full_pages, rebuild=self.rebuild)
        pool.attach_owner(self)

    def owns_full(self, page: int) -> bool:
        return self.tree.owns_full(page)

    def owns_swa(self, page: int) -> bool:
        return self.pool.hybrid and self.tree.owns_swa(page)

    def counters(self) -> dict[str, int]:
        return {k: self.tree.counters[k] for k in COUNTERS}

    # ---- admission -------------------------------------------------------------------
    def cached_len(self, prompt_ids: list[int], namespace: Hashable = None) -> int:
        """Prompt tokens a request admitted now would reuse (no side effects)."""
        return self.tree.peek(prompt_ids[:-1], namespace)

    def admit(self, seq: SeqKV, tokens: list[int], prompt_len: int, max_len: int,
              namespace: Hashable = None) -> int:
        """Point a new request's page tables at the window-safe cached prefix of `tokens`
        (its prompt; prompt and output so far when resuming after preemption) but the last
        token, which must be computed to produce logits; lock it, and note which SWA pages
        retention will want from the request. `namespace`: the key space (media hashes of
        a multimodal prompt; None for text), kept for the request's later syncs and insert.
        Returns cached tokens."""
        seq.namespace = namespace
        m = self.tree.match(tokens[:-1], namespace)
        seq.branch_len = m.prefix_len
        if m.rebuild:
            # The request recomputes [length, full_len) for its SWA layers only; see SeqKV.
            seq.full_cached_to, seq.swa_floor = m.full_len, m.length
            seq.swa_exact_from = m.swa_exact_from
            seq.lock_window = False
        if self.pool.hybrid and not self.tree.policy.keep_all:
            exact = self._first_exact_page(seq)
            seq.keep_swa = frozenset(p for p in self.tree.keep_pages(max_len, prompt_len,
                                                                     m.prefix_len) if p >= exact)
        part = self.tree.partial(m, tokens[:-1])
        if m.full_len:
            self.tree.lock(m.node, seq.lock_window)
            seq.node = m.node
            seq.full_pages = list(m.full_pages)
            if self.pool.hybrid:
                seq.swa_pages = list(m.swa_pages)
                seq.swa_released = m.swa_first
        return m.length + (self._copy_partial(seq, m.length, part) if part else 0)

    def _copy_partial(self, seq: SeqKV, length: int, part: PartialPage) -> int:
        """Give the request its page after `length` (a page multiple) with the partial
        page's first rows copied in, or a tail's own pages where none is free; returns the
        tokens it holds (0: no room). The source is made the youngest of its order before
        room is made, and checked after."""
        hybrid = self.pool.hybrid

        def free() -> bool:
            return (self.pool.full.allocator.num_free > 0
                    and (not hybrid or self.pool.swa.allocator.num_free > 0))
        self.tree.touch(part)
        if part.child is None and not free():
            self.tree.hand_over(part)       # (making room would evict tails first)
            self.pool.attach(seq, part.full, part.swa)
        else:
            self.make_room(1, 1 if hybrid else 0)
            if not self.tree.still_holds(part) or not free():
                return 0
            self.pool.grow(seq, length + part.tokens)
            self.pool.copy_rows(seq, length // self.P, part.full, part.swa, part.tokens)
        self.tree.reused(part)
        return part.tokens

    def _first_exact_page(self, seq: SeqKV) -> int:
        """First logical page whose SWA KV the request computes exactly (all of them but a
        window rebuild's first ones, see SeqKV): the only ones retention keeps."""
        return -(-seq.swa_exact_from // self.P)

    def _offered_swa(self, seq: SeqKV, n: int) -> list[int | None] | None:
        """The request's SWA pages of its first n logical pages that the cache may take:
        none starting before `swa_exact_from` (a rebuild's inexact SWA KV)."""
        if not self.pool.hybrid:
            return None
        exact = self._first_exact_page(seq)
        return [None if i < exact else p for i, p in enumerate(seq.swa_pages[:n])]

    # ---- while running / at the end -----------------------------------------------------
    def sync(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """Insert the request's whole pages of KV so far and move its lock to the longest
        window-safe cached prefix of them (call before `DualPool.release_window`).

        `tokens` must end no later than the point window release keeps SWA from (the
        computed length less a lagging drafter's `swa_lag`): the tree then holds none of
        the request's SWA pages outside the window the new lock covers. The lock's node is
        a plain window-safe match (never a rebuild: its window is live by construction);
        where the tree held its own copy of tokens the request recomputed, the request
        adopts that copy (`DualPool.adopt`, freeing its duplicates) so that the lock pins
        only pages in the request's tables."""
        n = len(tokens) // self.P
        if n == 0:
            return
        self.tree.insert(tokens[:n * self.P], seq.full_pages[:n], self._offered_swa(seq, n),
                         seq.namespace, prompt_len=prompt_len, revive=False,
                         branch_len=seq.branch_len, protect=seq.protect)
        # Pages the tree did not take stay the request's own until it finishes.
        m = self.tree.match(tokens[:n * self.P], seq.namespace, count=False, rebuild=0)
        locked = _locked(seq)
        if m.node is locked or m.length < (locked.end if locked else 0):
            return
        self.tree.lock(m.node)
        full = {i: p for i, p in enumerate(m.full_pages) if seq.full_pages[i] != p}
        swa = ({i: p for i, p in enumerate(m.swa_pages)
                if p is not None and seq.swa_pages[i] not in (None, p)}
               if self.pool.hybrid else {})
        if full or swa:
            self.pool.adopt(seq, full, swa)
        self.tree.unlock(locked, seq.lock_window, unpinned=seq.unpinned)
        seq.node, seq.lock_window, seq.unpinned = m.node, True, 0

    def window_released(self, seq: SeqKV) -> None:
        """Window release dropped SWA pages from the request's table: let go of the lock's
        pins on the leading pages of its window that the table no longer holds (the
        request never reads them again). The rest of the window, and the full lock, stay."""
        node = _locked(seq)
        if node is None or not seq.lock_window or not self.pool.hybrid:
            return
        table, upto = seq.swa_pages, seq.unpinned
        for g, page in sorted(self.tree.window_of(node)):
            if g < upto:
                continue
            if g < len(table) and table[g] == page:
                break
            upto = g + 1
        if upto > seq.unpinned:
            self.tree.unpin(node, seq.unpinned, upto)
            seq.unpinned = upto

    def finish(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """Offer the finished (or aborted) request's KV to the tree, then let go of
        everything. `tokens`: the tokens whose KV is computed."""
        n = len(tokens) // self.P
        if n:
            res = self.tree.insert(tokens[:n * self.P], seq.full_pages[:n],
                                   self._offered_swa(seq, n), seq.namespace,
                                   prompt_len=prompt_len, branch_len=seq.branch_len,
                                   protect=seq.protect)
            for full_page, swa_page in res.remap:
                self.pool.map_pages(full_page, swa_page)
        if len(tokens) % self.P:
            self._keep_tail(seq, tokens, n)
        node, seq.node, window, unpinned = _locked(seq), None, seq.lock_window, seq.unpinned
        self.pool.free_seq(seq)        # frees only pages the tree does not own
        self.tree.unlock(node, window, unpinned=unpinned)

    def _keep_tail(self, seq: SeqKV, tokens: list[int], n: int) -> None:
        """Offer the request's partial last page (logical page n) as its path's tail: only
        a page of its own, with exact SWA KV (radix/tails.py)."""
        if n == 0 or len(seq.full_pages) <= n:
            return
        swa = None
        if self.pool.hybrid:
            swa = seq.swa_pages[n] if n < len(seq.swa_pages) else None
            if swa is None or n * self.P < seq.swa_exact_from:
                return
        self.tree.keep_tail(tokens[:n * self.P], tokens[n * self.P:], seq.full_pages[n], swa,
                            seq.namespace)

    def release(self, seq: SeqKV) -> None:
        """Undo `admit`: no KV offered, and a rebuild match's leaf is left as it was (its
        full KV is what a later admission rebuilds from; finishing would trim it)."""
        node, seq.node, window, unpinned = _locked(seq), None, seq.lock_window, seq.unpinned
        self.pool.free_seq(seq)
        self.tree.unlock(node, window, fix=False, unpinned=unpinned)

    def pinned_outside(self, seq: SeqKV) -> tuple[int, int]:
        """SWA pages the lock still pins that the request's table no longer holds (none once
        `window_released` has run after window release). Full: none, since the lock's path
        is the request's own table (`sync` adopts the tree's copy before locking it)."""
        node = _locked(seq)
        if node is None or not seq.lock_window or not self.pool.hybrid:
            return 0, 0
        table = seq.swa_pages
        return 0, sum(g >= seq.unpinned and (g >= len(table) or table[g] != page)
                      for g, page in self.tree.window_of(node))

    def hold(self, tokens: list[int], namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        return self.tree.hold(tokens, namespace, seconds, protect)

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
