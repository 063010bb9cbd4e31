"""Promotion: a hit that reaches past L1 brought up into it, from L2 and from staged L3
payloads (the "up" half of TieredPrefixCache, whose docstring states the rules).

The hit is planned over all tiers by the L1 rule (`hit_plan.best_hit`); the pages L1 lacks
are copied into fresh L1 pages, and the tree takes them as if a request had just computed
them. Whatever fails before the tree takes them frees exactly the new pages.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .hit_plan import best_hit, window_of
from .keys import FULL, SWA

if TYPE_CHECKING:
    from ..pool.dual_pool import DualPool
    from ..radix.cache import RadixPrefixCache
    from ..radix.tree import RadixTree
    from .host_pool import HostPool
    from .keys import KeyChain
    from .page_io import PageIO
    from .storage import Payload
    from .tier_stats import TierCounters


class PromotionMixin:
    # Set by TieredPrefixCache.__init__.
    l1: RadixPrefixCache
    tree: RadixTree
    pool: DualPool
    keys: KeyChain
    io: dict[str, PageIO]
    host: HostPool | None
    l2: TierCounters
    l3: TierCounters
    P: int
    W: int
    hybrid: bool

    def _remember(self, name: str) -> None: ...

    def promote(self, tokens, namespace=None,
                staged: dict[tuple[str, bytes], Payload] | None = None,
                keys: list[bytes] | None = None) -> int:
        """Bring the longest tiered hit of `tokens` (whole pages) into L1, from L2 and from
        `staged` L3 payloads; returns the pages promoted (0: L1's own hit is as long).
        `keys`: the page keys of `tokens`, when the caller has them."""
        P, n_all = self.P, len(tokens) // self.P
        if n_all == 0:
            return 0
        if keys is None:
            keys = self.keys.page_keys(tokens[:n_all * P], namespace)
        assert len(keys) == n_all
        staged = staged or {}
        pins: list[tuple[str, list[int]]] = []
        try:
            for _ in range(3):
                plan = self._plan(tokens, namespace, keys, staged)
                if plan is None:
                    return 0
                n, l1f, l1s, need_f, need_s = plan
                for kind, idx in ((FULL, need_f), (SWA, need_s)):
                    hk = [keys[i] for i in idx if self._in_host(kind, keys[i])]
                    if hk:
                        pins.append((kind, self.host.stores[kind].pin(hk)))  # type: ignore[union-attr]
                fa, sa = self.pool.full.allocator, self.pool.swa.allocator
                if fa.num_free >= len(need_f) and (not self.hybrid or sa.num_free >= len(need_s)):
                    break
                # Eviction may move pages of the plan down to L2: plan again after it.
                self.l1.make_room(len(need_f), len(need_s))
            else:
                return 0
            fa, sa = self.pool.full.allocator, self.pool.swa.allocator
            if fa.num_free < len(need_f) or (self.hybrid and sa.num_free < len(need_s)):
                return 0
            self._load(tokens[:n * P], namespace, n, keys, l1f, l1s, need_f, need_s, staged)
            return len(need_f)
        finally:
            for kind, slots in pins:
                self.host.stores[kind].unpin(slots)  # type: ignore[union-attr]

    def _in_host(self, kind: str, key: bytes) -> bool:
        return self.host is not None and kind in self.host.stores and \
            self.host.stores[kind].has(key)

    def _plan(self, tokens, namespace, keys: list[bytes], staged):
        """(n, L1 path full pages, L1 path SWA pages, full pages to load, SWA pages to load)
        of the longest tiered hit, or None when L1's own is as long."""
        n_all = len(keys)
        floor = self.tree.peek(tokens[:n_all * self.P], namespace, rebuild=0) // self.P
        l1f, l1s = self.tree.path_pages(tokens[:n_all * self.P], namespace)
        full_ok = [i < len(l1f) or self._in_host(FULL, keys[i]) or (FULL, keys[i]) in staged
                   for i in range(n_all)]
        swa_ok = None
        if self.hybrid:
            swa_ok = [(i < len(l1s) and l1s[i] >= 0) or self._in_host(SWA, keys[i])
                      or (SWA, keys[i]) in staged for i in range(n_all)]
        n = best_hit(full_ok, swa_ok, self.W, self.P, floor)
        if n <= floor:
            return None
        need_f = list(range(len(l1f), n))
        need_s = ([i for i in window_of(n, self.W, self.P) if not (i < len(l1s) and l1s[i] >= 0)]
                  if self.hybrid else [])
        return n, l1f, l1s, need_f, need_s

    def _rows(self, kind: str, keys: list[bytes], staged, counters_by_src: dict):
        """Rows of these pages from L2 or the staged L3 payloads (L2 first): one gather
        per source."""
        import torch
        io = self.io[kind]
        store = self.host.stores.get(kind) if self.host is not None else None
        in_l2 = [j for j, key in enumerate(keys) if store is not None and store.has(key)]
        l2set = set(in_l2)
        from_l3 = [j for j in range(len(keys)) if j not in l2set]
        l2_rows = l3_rows = None
        if in_l2:
            assert store is not None
            slots = torch.tensor([store.index[keys[j]] for j in in_l2], dtype=torch.int64)
            l2_rows = store.rows.index_select(0, slots)
            counters_by_src[self.l2] = counters_by_src.get(self.l2, 0) + len(in_l2)
        if from_l3:
            l3_rows = io.rows_from_bytes([staged[(kind, keys[j])] for j in from_l3])
            assert l3_rows is not None     # sizes were checked when fetched
            counters_by_src[self.l3] = counters_by_src.get(self.l3, 0) + len(from_l3)
            for j in from_l3:
                self._remember(self.keys.name(kind, keys[j]))   # L3 has it: no write back
        if l3_rows is None:
            return l2_rows if l2_rows is not None else torch.empty(0, io.row_elems, dtype=io.dtype)
        if l2_rows is None:
            return l3_rows
        out = torch.empty(len(keys), io.row_elems, dtype=io.dtype)
        out[in_l2] = l2_rows
        out[from_l3] = l3_rows
        return out

    def _load(self, tokens, namespace, n, keys, l1f, l1s, need_f, need_s, staged) -> None:
        pool = self.pool
        tmp = pool.new_seq()
        tmp.namespace = namespace
        # The new pages go into `tmp` at once, so whatever fails below frees exactly them
        # (`free_seq` never frees the tree's pages on the path).
        tmp.full_pages = l1f[:min(n, len(l1f))]
        try:
            newf = pool.full.allocator.alloc(len(need_f))
            tmp.full_pages += newf
            news: list[int] = []
            if self.hybrid:
                news = pool.swa.allocator.alloc(len(need_s))
                swa: list[int | None] = [None] * n
                for i in window_of(n, self.W, self.P):
                    if i < len(l1s) and l1s[i] >= 0:
                        swa[i] = l1s[i]
                for i, page in zip(need_s, news):
                    swa[i] = page
                    pool.map_pages(tmp.full_pages[i], page)
                tmp.swa_pages = swa
            src_f: dict = {}
            src_s: dict = {}
            rows_f = self._rows(FULL, [keys[i] for i in need_f], staged, src_f)
            self.io[FULL].scatter(newf, rows_f)
            if need_s:
                rows_s = self._rows(SWA, [keys[i] for i in need_s], staged, src_s)
                self.io[SWA].scatter(news, rows_s)
        except BaseException:
            pool.free_seq(tmp)
            raise
        # As if a request had computed [0, n) and finished: the tree takes what it keeps
        # (reviving tombstoned windows), the rest is freed.
        self.l1.finish(tmp, tokens, prompt_len=n * self.P + 1)
        for counters, src in ((src_f, FULL), (src_s, SWA)):
            for tier, pages in counters.items():
                tier.pages_read[src] += pages
                tier.bytes_read += pages * self.io[src].row_bytes
        P = self.P
        for tier, pages in src_f.items():
            tier.hit_tokens += pages * P
