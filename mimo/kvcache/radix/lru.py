"""The radix tree's clock and its two LRU orders, kept as lazy heaps.

- whole nodes, by `Node.time` (last use as a prefix): only unlocked leaves are candidates,
  so a path is evicted from its end towards the root;
- SWA segments, by `Node.swa_time` (last match that *ended* in the node, or last write).
An entry is valid while its node lives and its time is unchanged: every time update pushes
a new entry, and stale ones are skipped when they reach the top (or dropped by `compact`).
Equal times leave in push order (a sequence number breaks ties).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from .node import Node

Entry = tuple[int, int, Node]


class LRU:
    def __init__(self, hybrid: bool) -> None:
        self.hybrid = hybrid                # nodes carry SWA: the SWA order is kept
        self.clock = 0                      # a tick per match, insert or hold
        self._seq = itertools.count()       # heap tie-breaker
        self.leaves: list[Entry] = []       # (time, seq, node): whole-node LRU
        self.swa: list[Entry] = []          # (swa_time, seq, node): SWA-only LRU
        self.cap = 65536                    # compact the heaps once they grow past this

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def push_leaf(self, node: Node) -> None:
        """Enter `node` in the node order if it is an eviction candidate now."""
        if not node.children and node.lock_ref == 0 and node.parent is not None:
            heapq.heappush(self.leaves, (node.time, next(self._seq), node))

    def push_swa(self, node: Node) -> None:
        if self.hybrid and node.parent is not None:
            heapq.heappush(self.swa, (node.swa_time, next(self._seq), node))

    def top_leaf(self) -> Node | None:
        """The least recently used unlocked leaf, or None."""
        return _top(self.leaves, lambda n, t: (n.alive and n.time == t and not n.children
                                               and n.lock_ref == 0))

    def top_swa(self, freeable: Callable[[Node], bool]) -> Node | None:
        """The node with the least recently used SWA that `freeable` says can go, or None
        (entries it refuses leave the heap: a caller that makes them freeable again
        pushes them again)."""
        return _top(self.swa, lambda n, t: n.alive and n.swa_time == t and freeable(n))

    def compact(self) -> None:
        """Drop stale entries (every time update pushes a new one); amortized O(1)."""
        if len(self.leaves) + len(self.swa) <= self.cap:
            return
        self.leaves = [e for e in self.leaves if e[2].alive and e[2].time == e[0]]
        self.swa = [e for e in self.swa if e[2].alive and e[2].swa_time == e[0]]
        heapq.heapify(self.leaves)
        heapq.heapify(self.swa)
        self.cap = max(65536, 2 * (len(self.leaves) + len(self.swa)))

    def rebuild(self, nodes: Iterable[Node]) -> None:
        """Both heaps afresh from every node (a repair, see `Evictor.evict`)."""
        self.leaves, self.swa = [], []
        for n in nodes:
            self.push_leaf(n)
            self.push_swa(n)


def _top(heap: list[Entry], ok: Callable[[Node, int], bool]) -> Node | None:
    while heap:
        t, _, node = heap[0]
        if ok(node, t):
            return node
        heapq.heappop(heap)
    return None
