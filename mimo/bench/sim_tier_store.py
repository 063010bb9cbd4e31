"""The tier simulator's page keys (chained page hashes, as the real tiers chain theirs) and
its LRU byte-budgeted tier store; the rules are in `sim_tiers`' docstring."""
from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..kvcache.radix.retention import window_first_page

TIERS = ("L1", "L2", "L3")
_M63 = np.uint64((1 << 63) - 1)
# Per-slot multipliers of a page's token hash (odd, so no token bit is lost).
_MULT = np.random.default_rng(0x6D696D6F).integers(1, 1 << 62, size=1024, dtype=np.uint64) * \
    np.uint64(2) + np.uint64(1)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(v: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every bit."""
    v = (v ^ (v >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    v = (v ^ (v >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return v ^ (v >> np.uint64(31))


def page_hashes(tokens, first_page: int, n_pages: int, page: int) -> np.ndarray:
    """One 64-bit hash per whole page of `tokens`, mixed with the page's position, so the
    sum over a prefix's pages (`chain`) names the prefix, order included."""
    t = np.frombuffer(tokens, dtype=np.int64, count=n_pages * page).view(np.uint64)
    v = (t.reshape(n_pages, page) * _MULT[:page]).sum(axis=1, dtype=np.uint64)
    return _mix(v ^ (np.arange(first_page, first_page + n_pages, dtype=np.uint64) * _GOLD))


def chain(base: int, hashes: np.ndarray) -> np.ndarray:
    """Running chain values after each page (uint64, wrapping), from the value `base` before
    the first. A page's key is its chain value: the identity of the prefix ending there."""
    return np.cumsum(hashes, dtype=np.uint64) + np.uint64(base)


def full_keys(values: np.ndarray) -> list[int]:
    """The full-KV keys of chain values (even); a page's SWA key is its full key | 1."""
    return ((values & _M63) << np.uint64(1)).tolist()


def namespace_base(ns) -> int:
    return hash(("mimo-kv-page", ns)) & ((1 << 64) - 1)


def safe_pages(live: Callable[[int], bool], q: int, window: int, page: int) -> int:
    """Largest p <= q such that every page of the window before p * page is live (0 if
    none): the window-safe rule of `RadixTree`, with liveness from any tier."""
    while q > 0:
        for j in range(q - 1, window_first_page(q * page, window, page) - 1, -1):
            if not live(j):
                q = j
                break
        else:
            return q
    return 0


def _percentiles(a: array) -> dict:
    if not len(a):
        return {"hits": 0}
    v = np.frombuffer(a, dtype=np.float64)
    return {"hits": len(a), **{f"p{q}": round(float(np.percentile(v, q)), 1) for q in (50, 90, 99)},
            "max": round(float(v.max()), 1)}


class TierStore:
    """One tier below L1: an LRU of page keys within a byte budget (value: the page's birth).
    Budget 0: no such tier, it stores nothing."""

    def __init__(self, name: str, budget: int, full_bytes: int, swa_bytes: int):
        self.name, self.budget = name, budget
        self.cost = (full_bytes, swa_bytes)            # by key & 1
        self.pages: OrderedDict[int, float] = OrderedDict()   # oldest first
        self.used = self.swa_pages = 0
        self.written = self.read = self.evicted = 0    # bytes

    def __contains__(self, key: int) -> bool:
        return key in self.pages

    def touch(self, key: int) -> None:
        if key in self.pages:
            self.pages.move_to_end(key)

    def put(self, key: int, birth: float) -> None:
        """Store a page (or refresh it if held), evicting LRU pages to fit."""
        pages = self.pages
        if key in pages:
            pages.move_to_end(key)
            return
        cost = self.cost[key & 1]
        if cost > self.budget:
            return
        while self.used + cost > self.budget:
            k, _ = pages.popitem(last=False)
            self.used -= self.cost[k & 1]
            self.evicted += self.cost[k & 1]
            self.swa_pages -= k & 1
        pages[key] = birth
        self.used += cost
        self.written += cost
        self.swa_pages += key & 1

    def check_integrity(self) -> None:
        swa = sum(k & 1 for k in self.pages)
        assert swa == self.swa_pages, f"{self.name}: SWA page count drifted"
        assert self.used == (len(self.pages) - swa) * self.cost[0] + swa * self.cost[1]
        assert 0 <= self.used <= self.budget, f"{self.name}: {self.used} > {self.budget} bytes"

    def stats(self) -> dict:
        return {"budget_bytes": self.budget, "used_bytes": self.used,
                "full_pages": len(self.pages) - self.swa_pages, "swa_pages": self.swa_pages,
                "bytes_written": self.written, "bytes_read": self.read,
                "bytes_evicted": self.evicted}
