"""PrefixCache: what the scheduler asks of a prefix cache, and nothing more.

The scheduler holds one `PrefixCache` (or None: no caching) and calls only these methods, so
another cache (a different tree, a tiered store, an external KV service) plugs in without
touching the scheduler or the decode step (`EngineParts.prefix_cache`). The SWA-aware radix
tree's is `RadixPrefixCache` (cache.py), the default.

Ownership rule every implementation keeps: a page it shares with a request is never freed by
`DualPool.free_seq` (the cache attaches itself to the pool as its `PageOwner`, whose
`owns_full` / `owns_swa` say which pages are shared), and a page a running request reads is
never evicted while it runs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable

from ..pool.seq_kv import SeqKV


class PrefixCache(ABC):
    @abstractmethod
    def owns_full(self, page: int) -> bool:
        """Whether a full page is the cache's (`PageOwner`): no request frees it."""

    @abstractmethod
    def owns_swa(self, page: int) -> bool:
        """Whether an SWA page is the cache's (`PageOwner`)."""

    @abstractmethod
    def cached_len(self, tokens: list[int], namespace: Hashable = None) -> int:
        """Tokens a request admitted now would reuse; no side effects (queue ordering)."""

    @abstractmethod
    def admit(self, seq: SeqKV, tokens: list[int], prompt_len: int, max_len: int,
              namespace: Hashable = None) -> int:
        """Point a new request's page tables at its cached prefix (all but the last token)
        and protect it; returns the cached tokens. Not always whole pages: the request may
        get a page of its own already holding the first rows' KV (radix/tails.py)."""

    @abstractmethod
    def sync(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """A running request computed more prompt KV (`tokens` have KV): share it."""

    @abstractmethod
    def finish(self, seq: SeqKV, tokens: list[int], prompt_len: int) -> None:
        """The request ended (or was preempted): keep what is worth keeping, free the rest
        of its pages (`DualPool.free_seq`) and drop its protection."""

    def release(self, seq: SeqKV) -> None:
        """Undo `admit` for a request that was not admitted after all (no room): drop its
        protection and its pages and leave the cache as the match found it."""
        self.finish(seq, [], 0)

    def window_released(self, seq: SeqKV) -> None:
        """`DualPool.release_window` dropped SWA pages from the request's table: protection
        on pages it will not read again may go (called after every release)."""
        return None

    def pinned_outside(self, seq: SeqKV) -> tuple[int, int]:
        """(full, SWA) pages the request's protection keeps in use that are not in its own
        tables. The scheduler reserves them for the request (the rule in scheduler.py)."""
        return 0, 0

    def hold(self, tokens: list[int], namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        """A finished request's session paused in a tool call: keep its cached `tokens`
        (and the SWA window before their end) after everything else for `seconds`.
        Returns the tokens held; a cache without priorities holds nothing."""
        return 0

    @abstractmethod
    def make_room(self, full: int, swa: int) -> None:
        """Evict until `full` / `swa` pages are free, or nothing evictable is left."""

    @abstractmethod
    def check_integrity(self) -> None:
        ...

    def counters(self) -> dict[str, int]:
        """Running totals for monitoring (names in `COUNTERS`); empty if it keeps none."""
        return {}


# What `counters()` may report; /metrics exports these (missing ones as 0).
COUNTERS = {
    "cut_never_kept": "prompt tokens equal to a cached prefix but not reused: no SWA window "
                      "was ever kept where they end (a fork retention did not foresee)",
    "cut_evicted": "prompt tokens equal to a cached prefix but not reused: the SWA window "
                   "where they end was evicted (SWA pool pressure)",
    "rebuilt_tokens": "prompt tokens reused past a missing SWA window by recomputing only the "
                      "SWA layers' receptive field before the cached prefix's end",
    "evicted_full": "full pages freed by evicting cached nodes",
    "evicted_swa": "SWA pages freed by evicting cached nodes",
    "tombstoned_swa": "SWA pages freed alone, their full KV kept (SWA-only eviction)",
    "revived_swa": "tombstoned SWA pages filled again by a request that recomputed them",
    "held": "finished requests paused in a tool call whose KV is held after everything else",
    "partial_tokens": "prompt tokens reused from the first rows of a cached page (a request's "
                      "partial last page, or a page agreeing only in part) by copying them",
}
