"""TieredPrefixCache: the L1 radix cache with host memory (L2) and shared storage (L3) below.

L1 stays the one prefix cache the scheduler talks to; the tiers only move pages in and out
of it, so every L1 rule (window-safe matches, locks, the ownership of pages, the lock rule
of admission) holds unchanged:
- **down**: pages L1 evicts (whole nodes, and SWA-only evictions) are copied to L2 just
  before they are freed (`RadixTree.on_evict`, write-back). Prefixes are written through to
  L3 as their prefill proceeds (every chunk's `sync`) and when the request ends: full KV for
  every page L1 caches, SWA KV only for the windows L1 keeps (its retention checkpoints;
  never the pages it keeps only as spare, `RadixTree.spare_swa`).
- **up** (`promote`): a hit that reaches past L1 is planned over all tiers by the L1 rule
  (`hit_plan.best_hit`): full KV of pages [0, n) and SWA of the window before n, each page
  from whichever tier has it (a split hit: full KV in L1, the window from L2). The missing
  pages are copied into fresh L1 pages and inserted into the tree as if a request had just
  computed them; then L1 admits the request as usual. L2 promotion runs at admission on
  the engine thread (a memory copy). L3 payloads are fetched before admission, off-thread,
  by the engine's loader (engine/tier_loader.py), and promoted when they arrive.
- **keep-alive**: a hit served by L1 or L2 touches the prefix's L3 keys at most every
  `kv_keepalive` seconds, so an L3 with its own LRU (disk cap, Redis maxmemory) keeps it.
- **consistency repair**: at admission (where a match splits a node) and at every prefill
  chunk, whatever L1 holds of the prefix that L3 is not known to hold is written down.
A tier that fails is a miss: the hit is shorter and the request recomputes the rest.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Hashable

from ...config import TierConfig
from ..pool.seq_kv import SeqKV
from ..radix.cache import RadixPrefixCache
from ..radix.node import Node
from ..radix.prefix_cache import PrefixCache
from .hit_plan import best_hit, window_of
from .host_pool import HostPool
from .keys import FULL, SWA, KeyChain, node_keys
from .page_io import PageIO
from .promotion import PromotionMixin
from .storage_tier import FetchPlan, StorageTier
from .tier_stats import TierCounters

log = logging.getLogger("mimo.kvcache.tiers")

_KNOWN_CAP = 1 << 20        # storage names remembered as written (LRU)


class TieredPrefixCache(PromotionMixin, PrefixCache):
    def __init__(self, l1: RadixPrefixCache, keys: KeyChain, io: dict[str, PageIO],
                 host: HostPool | None, storage: StorageTier | None, cfg: TierConfig):
        self.l1, self.tree, self.pool = l1, l1.tree, l1.pool
        self.keys, self.io, self.host, self.storage, self.cfg = keys, io, host, storage, cfg
        self.P, self.W = self.pool.page_size, self.pool.window
        self.hybrid = self.pool.hybrid
        self.l2, self.l3 = TierCounters(), TierCounters()
        self.l1_hit_tokens = 0
        self.load_errors = 0            # promotions that raised (the request recomputed)
        self._written: OrderedDict[str, None] = OrderedDict()
        self._touched: OrderedDict[bytes, float] = OrderedDict()
        self._ns: dict[int, Hashable] = {}
        if host is not None:
            self.tree.on_evict = self._write_back

    # ---- PrefixCache: delegated to L1 ---------------------------------------------------
    def owns_full(self, page: int) -> bool:
        return self.l1.owns_full(page)

    def owns_swa(self, page: int) -> bool:
        return self.l1.owns_swa(page)

    def cached_len(self, tokens: list[int], namespace: Hashable = None) -> int:
        return self.l1.cached_len(tokens, namespace)

    def release(self, seq: SeqKV) -> None:
        self.l1.release(seq)

    def window_released(self, seq: SeqKV) -> None:
        self.l1.window_released(seq)

    def pinned_outside(self, seq: SeqKV) -> tuple[int, int]:
        return self.l1.pinned_outside(seq)

    def hold(self, tokens: list[int], namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        # (L2 is plain LRU: what L1 evicts arrives there as its newest entries.)
        return self.l1.hold(tokens, namespace, seconds, protect)

    def make_room(self, full: int, swa: int) -> None:
        self.l1.make_room(full, swa)

    def counters(self) -> dict[str, int]:
        return self.l1.counters()

    def check_integrity(self) -> None:
        self.l1.check_integrity()
        if self.host is not None:
            self.host.check_integrity()

    # ---- admission ----------------------------------------------------------------------
    def admit(self, seq: SeqKV, tokens: list[int], prompt_len: int, max_len: int,
              namespace: Hashable = None) -> int:
        before = self.tree.peek(tokens[:-1], namespace)
        keys: list[bytes] = []
        if self.host is not None or self.storage is not None:
            # The prompt's page keys, hashed once for the promotion and the keep-alive.
            n_all = (len(tokens) - 1) // self.P
            keys = self.keys.page_keys(tokens[:n_all * self.P], namespace)
        if self.host is not None:
            try:
                self.promote(tokens[:-1], namespace, keys=keys)
            except Exception as e:  # noqa: BLE001 - a failed load is a miss: recompute
                self.load_errors += 1
                log.warning("loading a prefix from host memory failed: %r", e)
        got = self.l1.admit(seq, tokens, prompt_len, max_len, namespace)
        self.l1_hit_tokens += min(before, got)
        missed = max(len(tokens) - 1 - got, 0)
        for tier, on in ((self.l2, self.host is not None), (self.l3, self.storage is not None)):
            if on:
                tier.miss_tokens += missed
        if self.storage is not None and got:
            self._keep_alive(keys[:got // self.P])
            # Consistency repair (the match may have split a node here): what L1 holds of
            # the hit that L3 lacks goes down now (a dropped write, a prefix from L2).
            self._write_through(tokens[:got], namespace)
        return got

    # ---- down: write-back to L2, write-through to L3 -----------------------------------------
    def _node_keys(self, node: Node) -> list[bytes]:
        return node_keys(self.keys, node, self.tree.namespace_of, self._ns)

    def _write_back(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        assert self.host is not None
        keys = self._node_keys(node)
        swa_idx = [i for i in swa_idx if not self.tree.spare_swa((node.swa or [])[i])]
        for kind, idx, pages in ((FULL, full_idx, node.full), (SWA, swa_idx, node.swa or [])):
            store = self.host.stores.get(kind)
            idx = [i for i in idx if store is not None and not store.has(keys[i])]
            if not idx or store is None or not store.alloc.capacity:
                continue
            rows = self.io[kind].gather([pages[i] for i in idx])
            stored = store.put([keys[i] for i in idx], rows)
            self.l2.pages_written[kind] += stored
            self.l2.bytes_written += stored * self.io[kind].row_bytes

    def sync(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        self.l1.sync(seq, tokens, prompt_len)
        self._write_through(tokens, seq.namespace)

    def finish(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        ns = seq.namespace
        self.l1.finish(seq, tokens, prompt_len)
        if tokens:
            self._write_through(tokens, ns)

    def _write_through(self, tokens: list[int], namespace: Hashable) -> None:
        """Store what L1 caches of `tokens` that L3 lacks: full KV of every page, SWA of the
        live (kept) windows."""
        st = self.storage
        if st is None or self.cfg.kv_storage_write != "through":
            return
        for name in st.failed_keys():
            self._written.pop(name, None)
        path = self.tree.path_nodes(tokens, namespace)
        names: dict[str, list[str]] = {FULL: [], SWA: []}
        pages: dict[str, list[int]] = {FULL: [], SWA: []}
        for node, k in path:
            keys = self._node_keys(node)
            for i in range(k):
                for kind, page in ((FULL, node.full[i]),
                                   (SWA, node.swa[i] if node.swa is not None else -1)):
                    if page < 0 or (kind == SWA and self.tree.spare_swa(page)):
                        continue
                    name = self.keys.name(kind, keys[i])
                    if name not in self._written:
                        names[kind].append(name)
                        pages[kind].append(page)
        for kind in (FULL, SWA):
            if not names[kind]:
                continue
            rows = self.io[kind].gather(pages[kind])
            if st.write(names[kind], rows):
                for name in names[kind]:
                    self._remember(name)
                self.l3.pages_written[kind] += len(names[kind])
                self.l3.bytes_written += len(names[kind]) * self.io[kind].row_bytes

    def _remember(self, name: str) -> None:
        self._written[name] = None
        self._written.move_to_end(name)
        if len(self._written) > _KNOWN_CAP:
            self._written.popitem(last=False)

    def _keep_alive(self, keys: list[bytes]) -> None:
        """Touch the L3 entries of the prefix these page keys name."""
        if self.cfg.kv_keepalive <= 0 or self.storage is None:
            return
        if not keys:
            return
        now = time.monotonic()
        last = self._touched.get(keys[-1])
        if last is not None and now - last < self.cfg.kv_keepalive:
            return
        self._touched[keys[-1]] = now
        self._touched.move_to_end(keys[-1])
        if len(self._touched) > 65536:
            self._touched.popitem(last=False)
        names = [self.keys.name(FULL, k) for k in keys]
        if self.hybrid:
            names += [self.keys.name(SWA, keys[i]) for i in window_of(len(keys), self.W, self.P)]
        self.storage.touch(names)

    # ---- L3 lookups (the engine's loader) -----------------------------------------------------
    def fetch_plan(self, tokens: list[int], namespace: Hashable = None) -> FetchPlan | None:
        """What to ask L3 for a request about to wait for it; None when L3 cannot lengthen
        its hit (no storage, or every page already in the tiers above)."""
        if self.storage is None:
            return None
        n_all = len(tokens) // self.P
        if n_all == 0:
            return None
        keys = self.keys.page_keys(tokens[:n_all * self.P], namespace)
        l1f, l1s = self.tree.path_pages(tokens[:n_all * self.P], namespace)
        local_full = [i < len(l1f) or self._in_host(FULL, keys[i]) for i in range(n_all)]
        local_swa = None
        if self.hybrid:
            local_swa = [(i < len(l1s) and l1s[i] >= 0) or self._in_host(SWA, keys[i])
                         for i in range(n_all)]
        floor = best_hit(local_full, local_swa, self.W, self.P)
        if floor == n_all:
            return None
        return FetchPlan(keys, local_full, local_swa, floor)

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()
