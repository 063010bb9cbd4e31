"""Nodes of the SWA-aware radix tree and the structural helpers the tree is built from.

See `tree.py` for the rules. Positions are token positions from the root; logical
page g covers positions [g * P, (g + 1) * P); a node covers pages [start / P, end / P).
"""
from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .retention import window_first_page

if TYPE_CHECKING:
    import numpy as np

    from ..pool.allocator import PageAllocator
    from .retention import RetentionPolicy

NO_SWA = -1            # tombstone: this page's SWA KV was never kept (outside every window)
EVICTED_SWA = -2       # tombstone: it was kept, then freed by SWA-only eviction
SPECULATIVE = 1 << 40   # SWA-time handicap: dense-grid windows, superseded cached ends
# A session's head start in both LRU orders: younger than any keyless use for 2**38 ticks (a
# tick per match or insert), and less than SPECULATIVE, so a session's speculative windows
# still go before keyless firm ones. A session paused in a tool call: PAUSED (hold.py).
PROTECTED = 1 << 38
PAUSED = 1 << 39


class Node:
    __slots__ = ("parent", "children", "tokens", "full", "swa", "swa_lock", "start",
                 "lock_ref", "time", "swa_time", "alive", "keys")

    def __init__(self, parent, tokens, full, swa, start, now):
        self.parent: Node | None = parent
        self.children: dict[tuple, Node] = {}
        self.tokens: array = tokens          # len == len(full) * page_size
        self.full: list[int] = full
        self.swa: list[int] | None = swa     # < 0: tombstone; None in full-kv mode
        self.swa_lock: dict[int, int] = {}   # local page index -> lockers needing it
        self.start = start                   # token position of tokens[0]
        self.lock_ref = 0                    # lockers whose path includes this node
        self.time = now                      # node LRU: last use as (part of) a prefix
        self.swa_time = now                  # SWA LRU: last match ending here, or write
        self.alive = True
        # The tiers' page keys of this node's pages (tiers/keys.py), filled in when a tier
        # first needs them. A key names the whole prefix up to its page, which never
        # changes for a node's pages (a split hands the first ones to the new prefix node).
        self.keys: list[bytes] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class MatchResult:
    length: int                 # window-safe reusable tokens (page multiple)
    prefix_len: int             # tokens equal to a cached path (>= length): the branch point
    node: Node | None           # node ending at `length` (a root when length == 0)
    full_pages: list[int] = field(default_factory=list)           # one per page of `length`
    swa_pages: list[int | None] = field(default_factory=list)     # None outside the window
    swa_first: int = 0          # first logical page with SWA in swa_pages (window start)
    # Tokens whose full KV the match hands over (full_pages covers them). Equal to `length`
    # unless the match is a window rebuild: then the full KV runs on to `full_len` and the
    # request recomputes [length, full_len) only for its SWA layers (`RadixTree.match`).
    full_len: int = 0
    swa_exact_from: int = 0     # first position whose SWA KV the request computes exactly

    @property
    def rebuild(self) -> bool:
        return self.full_len > self.length


@dataclass
class InsertResult:
    dup_full: list[int]         # caller's full pages the tree did not take: caller frees
    dup_swa: list[int]          # caller's SWA pages the tree did not take: caller frees
    remap: list[tuple[int, int]]  # (tree full page, caller SWA page) revived: fix full->SWA map
    cached_len: int             # tokens of the sequence now in the tree


class TreeCore:
    """Walking, splitting and the window arithmetic, shared by the tree and its eviction."""
    # The tree's state, set by `RadixTree.__init__` and read by these helpers and the
    # eviction mixin built on them.
    P: int                              # page size (tokens)
    W: int                              # SWA window (tokens)
    mode: str
    hybrid: bool                        # mode == "hybrid": swa_alloc is set, nodes have swa
    rebuild: int
    full_alloc: PageAllocator
    swa_alloc: PageAllocator | None
    policy: RetentionPolicy
    unmap: Callable[[list[int]], None] | None
    _roots: dict[Hashable, Node]
    _own_f: np.ndarray
    _own_s: np.ndarray
    _clock: int
    _seq: Iterator[int]
    _leaf_heap: list[tuple[int, int, Node]]
    _swa_heap: list[tuple[int, int, Node]]
    _heap_cap: int
    counters: dict[str, int]
    on_evict: Callable[[Node, list[int], list[int]], None] | None

    @property
    def _swa_pool(self) -> PageAllocator:
        """The SWA allocator: every tree in hybrid mode has one (`RadixTree.__init__`), and
        only hybrid mode touches SWA pages."""
        assert self.swa_alloc is not None, "SWA pages outside hybrid mode"
        return self.swa_alloc

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _tok(self, tokens) -> array:
        return tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)

    def _root(self, ns, create=False) -> Node | None:
        r = self._roots.get(ns)
        if r is None and create:
            r = self._roots[ns] = Node(None, array("q"), [], [] if self.hybrid else None, 0, 0)
        return r

    def _nodes(self):
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                n = stack.pop()
                yield n
                stack.extend(n.children.values())

    def num_leaves(self) -> int:
        """Cached sequence ends: each holds a tail window in hybrid mode (the SWA pool's
        floor, `cache_sim.size_swa_share`)."""
        return sum(not n.children for n in self._nodes())

    def _walk(self, root: Node | None, toks: array, n_pages: int):
        """Path of (node, pages matched in it) along toks' first n_pages pages."""
        P, path, pos, node = self.P, [], 0, root
        while node is not None and pos // P < n_pages:
            child = node.children.get(tuple(toks[pos:pos + P]))
            if child is None:
                break
            k = min(len(child.full), n_pages - pos // P)
            if child.tokens[:k * P] != toks[pos:pos + k * P]:
                lo, hi = 1, k - 1       # first page equal (it is the key); find the last
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if child.tokens[:mid * P] == toks[pos:pos + mid * P]:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
            path.append((child, k))
            pos += k * P
            node = child if k == len(child.full) else None
        return path, pos

    def _safe_pages(self, live, q: int, lo: int = 0) -> int:
        """Largest p in (lo, q] with SWA live (live[i]) on every page of the window before
        p*P, or lo if there is none. `live`: a list, or a dict covering at least the pages
        of the windows before (lo, q] (`_path_live`)."""
        P, W = self.P, self.W
        while q > lo:
            for j in range(q - 1, window_first_page(q * P, W, P) - 1, -1):
                if not live[j]:
                    q = j           # any safe end must lie at or before the dead page
                    break
            else:
                return q
        return lo

    def _path_live(self, node: Node, first: int) -> dict[int, bool]:
        """Whether each logical page in [first, node.end / P) on node's path has live SWA:
        what `_safe_pages` reads to judge ends after page `first`'s window."""
        P, live, n = self.P, {}, node
        while n.parent is not None and n.end // P > first:
            s = n.start // P
            assert n.swa is not None        # a non-root node of a hybrid tree
            for i in range(max(first - s, 0), len(n.swa)):
                live[s + i] = n.swa[i] >= 0
            n = n.parent
        return live

    def _split(self, node: Node, k: int) -> Node:
        """Split `node` after its first k pages; the new prefix node is returned and `node`
        keeps the suffix (so its end, and references to it, do not change)."""
        P, parent = self.P, node.parent
        assert parent is not None           # a root holds no pages to split
        pre = Node(parent, node.tokens[:k * P], node.full[:k],
                   None if node.swa is None else node.swa[:k], node.start, node.time)
        pre.lock_ref, pre.swa_time = node.lock_ref, node.swa_time
        pre.swa_lock = {i: c for i, c in node.swa_lock.items() if i < k}
        node.swa_lock = {i - k: c for i, c in node.swa_lock.items() if i >= k}
        if node.keys is not None:
            pre.keys, node.keys = node.keys[:k], node.keys[k:]
        node.tokens, node.full = node.tokens[k * P:], node.full[k:]
        if node.swa is not None:
            node.swa = node.swa[k:]
        node.start += k * P
        parent.children[tuple(pre.tokens[:P])] = pre
        pre.children[tuple(node.tokens[:P])] = node
        node.parent = pre
        self._push_swa(pre)
        return pre

    def _window(self, node: Node):
        """(node, local page) pairs holding the window before node.end, walking up."""
        P = self.P
        out: list[tuple[Node, int]] = []
        first = window_first_page(node.end, self.W, P)
        n = node
        while n is not None and n.parent is not None and n.end // P > first:
            s = n.start // P
            out.extend((n, i - s) for i in range(max(first, s), n.end // P))
            n = n.parent
        return out

    # lazy heaps: an entry is valid while its node lives and its time is unchanged
    def _push_leaf(self, node: Node) -> None:
        if not node.children and node.lock_ref == 0 and node.parent is not None:
            heapq.heappush(self._leaf_heap, (node.time, next(self._seq), node))

    def _push_swa(self, node: Node) -> None:
        if self.hybrid and node.parent is not None:
            heapq.heappush(self._swa_heap, (node.swa_time, next(self._seq), node))
