"""SeqKV: the pages one request holds in the two pools. Bookkeeping only (no tensors).

Logical page p of a request covers token positions [p * page_size, (p + 1) * page_size).
Only `DualPool` moves pages between a SeqKV and the allocators; a prefix cache may point
entries of the tables at pages it owns (see `PageOwner`), which the request never frees.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SeqKV:
    full_pages: list[int] = field(default_factory=list)
    swa_pages: list[int | None] = field(default_factory=list)   # None: released
    swa_released: int = 0      # logical pages [0, swa_released) have no SWA page
    node: object = None        # prefix-cache node this request holds a lock on (or None)
    # Logical pages whose SWA a prefix cache wants offered when the request is inserted
    # (its retention checkpoints): window release holds them instead of freeing them.
    keep_swa: frozenset[int] = frozenset()
    branch_len: int = 0        # where the request left the cached path at admission
    namespace: object = None   # its prefix-cache key space (None: plain token ids)
    protect: bool = False      # a session's (prompt_cache_key): what it leaves evicted last
    # A window rebuild (RadixTree.match): the request holds the cache's full pages up to
    # `full_cached_to` but computes from `swa_floor` on. Its full layers must not write
    # positions below full_cached_to (the shared pages already hold that KV); its SWA
    # queries see no keys below swa_floor; its SWA KV is exact only from `swa_exact_from`
    # on, so pages starting earlier are never offered to the cache. Zeros otherwise.
    full_cached_to: int = 0
    swa_floor: int = 0
    swa_exact_from: int = 0
    lock_window: bool = True   # its cache lock covers the SWA window (False: rebuild lock)
    # Logical page below which the lock no longer pins its window: the request decoded past
    # those pages and window release dropped them (`PrefixCache.window_released`).
    unpinned: int = 0
