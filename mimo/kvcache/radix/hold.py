"""Paused sessions: the radix tree keeps the trailing window of a session paused in a tool
call after everything else, for a bounded time.

An agent turn that ends in a tool call comes back seconds to minutes later with the same
sequence plus the tool's output. Plain LRU makes those paused sessions the first to lose
their window under pressure: they are idle while other sessions run. `hold` stamps the
cached path of the paused sequence PAUSED ticks younger (whole nodes: the path's leaf goes
last; SWA: the window before its end goes last), above sessions with a prompt_cache_key
(PROTECTED) and far above speculative windows, so eviction order is:
speculative windows < keyless firm ones < finished sessions < paused sessions.
The stamp lasts `seconds` of `clock`; then (checked before every eviction) the
path's nodes still carrying it get their plain time back, the tick of the hold (a session's
plus PROTECTED), so a session that never returns ages like any other. A match or insert on
the path restamps it with its own time: a resumed session is running, and its next finish
decides again.
"""
from __future__ import annotations

import heapq
import itertools
import time
from array import array
from collections.abc import Callable, Hashable, Sequence

from .lru import LRU
from .node import PAUSED, PROTECTED, Node
from .paths import Paths

# (deadline, seq, tokens, namespace, stamp, base)
Hold = tuple[float, int, "array[int]", Hashable, int, int]


class HoldBook:
    def __init__(self, paths: Paths, lru: LRU, counters: dict[str, int], enabled: bool) -> None:
        self.paths, self.lru, self.counters = paths, lru, counters
        self.enabled = enabled              # mode "off" holds nothing
        self.clock: Callable[[], float] = time.monotonic
        self._holds: list[Hold] = []
        self._seq = itertools.count()

    def hold(self, tokens: Sequence[int], namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        """Keep the cached path equal to `tokens` (whole pages), and the SWA window before
        its end, after everything else for `seconds`. `protect`: the session sent a
        prompt_cache_key (its time once the hold ends is PROTECTED ticks younger). Returns
        the held tokens (0: nothing of `tokens` is cached, or seconds <= 0)."""
        if seconds <= 0 or not self.enabled:
            return 0
        root = self.paths.root(namespace)
        if root is None:
            return 0
        toks = self.paths.tok(tokens)
        path, m = self.paths.walk(root, toks, len(toks) // self.paths.P)
        if not path:
            return 0
        end, k = path[-1]
        if k < len(end.full):
            end = self.paths.split(end, k)  # stamp exactly the held path
        tick = self.lru.tick()
        stamp, base = tick + PAUSED, tick + (PROTECTED if protect else 0)
        n: Node | None = end
        while n is not None and n.parent is not None:
            if n.time < stamp:
                n.time = stamp
                self.lru.push_leaf(n)
            n = n.parent
        if self.paths.hybrid:
            for w in {id(w): w for w, _ in self.paths.window(end)}.values():
                if w.swa_time < stamp:
                    w.swa_time = stamp
                    self.lru.push_swa(w)
        heapq.heappush(self._holds, (self.clock() + seconds, next(self._seq),
                                     toks[:m], namespace, stamp, base))
        self.counters["held"] += 1
        return m

    def expire(self) -> int:
        """End the holds whose time is up; returns how many ended."""
        holds, now, done = self._holds, self.clock(), 0
        while holds and holds[0][0] <= now:
            _, _, toks, ns, stamp, base = heapq.heappop(holds)
            done += 1
            root = self.paths.root(ns)
            if root is None:
                continue
            for n, _ in self.paths.walk(root, toks, len(toks) // self.paths.P)[0]:
                if n.time == stamp:
                    n.time = base
                    self.lru.push_leaf(n)
                if self.paths.hybrid and n.swa_time == stamp:
                    n.swa_time = base
                    self.lru.push_swa(n)
        return done

    def __len__(self) -> int:
        """Holds not yet ended (some may be past their time until the next eviction)."""
        return len(self._holds)
