"""The prefix-match step: what the scheduler asks of a prefix cache, and nothing more.

The scheduler holds one `PrefixMatch` (or None: no caching) and calls only these methods, so
another cache (a different tree, a tiered store, an external KV service) plugs in without
touching the scheduler or the decode step. `PrefixCache` is the SWA-aware radix tree's.

Ownership rule every implementation keeps: a page it shares with a request is never freed by
`DualPool.free_seq` (the pool's `is_shared_*` hooks say which), and a page a running request
reads is never evicted while it runs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from .dual_pool import SeqKV


class PrefixMatch(ABC):
    @abstractmethod
    def cached_len(self, tokens: list[int], namespace=None) -> int:
        """Tokens a request admitted now would reuse; no side effects (queue ordering)."""

    @abstractmethod
    def admit(self, seq: SeqKV, tokens: list[int], prompt_len: int, max_len: int,
              namespace=None) -> int:
        """Point a new request's page tables at its cached prefix (all but the last token)
        and protect it; returns the cached tokens."""

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

    def pinned_outside(self, seq: SeqKV) -> tuple[int, int]:
        """(full, SWA) pages the request's protection keeps in use that are not in its own
        tables. The scheduler reserves them for the request (the rule in scheduler.py)."""
        return 0, 0

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
}
