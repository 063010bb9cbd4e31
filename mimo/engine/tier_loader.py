"""TierLoader: requests whose prefix may lie in shared storage (L3) wait here, outside the
running batch, while their pages are fetched off-thread; other requests keep stepping.

A request is held only when L3 could lengthen its hit (`TieredPrefixCache.fetch_plan`).
When its lookup completes (hit, miss, timeout or error alike) the payloads are promoted
into L1 and the request joins the scheduler's queue, where admission finds the pages in
L1 like any cached prefix. Engine thread only.
"""
from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sequence import NO_CACHE, Sequence

if TYPE_CHECKING:
    from ..kvcache.tiers.storage_tier import FetchPlan, FetchResult
    from ..kvcache.tiers.tiered_cache import TieredPrefixCache

log = logging.getLogger("mimo.engine")


@dataclass
class _Loading:
    seq: Sequence
    tokens: list[int]
    plan: FetchPlan
    future: concurrent.futures.Future[FetchResult]


class TierLoader:
    def __init__(self, cache: TieredPrefixCache):
        self.cache = cache
        self._loading: dict[int, _Loading] = {}

    def __len__(self) -> int:
        return len(self._loading)

    def start(self, seq: Sequence) -> bool:
        """Hold `seq` while L3 is asked for its prefix; False: queue it now."""
        ns = seq.cache_namespace
        if ns is NO_CACHE or self.cache.storage is None:
            return False
        tokens = seq.all_ids[:seq.prefill_end][:-1]
        plan = self.cache.fetch_plan(tokens, ns)
        if plan is None:
            return False
        self._loading[seq.id] = _Loading(seq, tokens, plan, self.cache.storage.fetch(plan))
        return True

    def ready(self) -> list[Sequence]:
        """Requests whose lookup finished, their pages promoted into L1."""
        out = []
        for sid, ld in list(self._loading.items()):
            if not ld.future.done():
                continue
            del self._loading[sid]
            try:
                res = ld.future.result()
                if res.pages > ld.plan.floor:
                    self.cache.promote(ld.tokens, ld.seq.cache_namespace, staged=res.payloads,
                                       keys=ld.plan.keys)
            except Exception as e:  # noqa: BLE001 - a failed load is a miss: recompute
                log.warning("loading a prefix from KV storage failed: %r", e)
            out.append(ld.seq)
        return out

    def abort(self, seq: Sequence) -> bool:
        ld = self._loading.pop(seq.id, None)
        if ld is None:
            return False
        ld.future.cancel()
        return True

    def wait(self, timeout: float) -> None:
        """Block until a lookup finishes or `timeout` passes (an engine with nothing else
        to do)."""
        futs = [ld.future for ld in self._loading.values()]
        if futs:
            concurrent.futures.wait(futs, timeout, return_when=concurrent.futures.FIRST_COMPLETED)
