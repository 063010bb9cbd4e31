"""Paused sessions: the radix tree keeps the trailing window of a session paused in a tool
call after everything else, for a bounded time.

An agent turn that ends in a tool call comes back seconds to minutes later with the same
sequence plus the tool's output. Plain LRU makes those paused sessions the first to lose
their window under pressure: they are idle while other sessions run. `hold` stamps the
cached path of the paused sequence PAUSED ticks younger (whole nodes: the path's leaf goes
last; SWA: the window before its end goes last), above sessions with a prompt_cache_key
(PROTECTED) and far above speculative windows, so eviction order is:
speculative windows < keyless firm ones < finished sessions < paused sessions.
The stamp lasts `seconds` of the tree's `clock`; then (checked before every eviction) the
path's nodes still carrying it get their plain time back, the tick of the hold (a session's
plus PROTECTED), so a session that never returns ages like any other. A match or insert on
the path restamps it with its own time: a resumed session is running, and its next finish
decides again.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Hashable

from .lock import LockMixin
from .node import PAUSED, PROTECTED, Node


class HoldMixin(LockMixin):          # LockMixin builds on EvictMixin, on TreeCore
    clock: Callable[[], float] = staticmethod(time.monotonic)
    _holds: list        # heap of (deadline, seq, tokens, namespace, stamp, base)
    _hold_seq: itertools.count

    def hold(self, tokens, namespace: Hashable = None, seconds: float = 0.0,
             protect: bool = False) -> int:
        """Keep the cached path equal to `tokens` (whole pages), and the SWA window before
        its end, after everything else for `seconds`. `protect`: the session sent a
        prompt_cache_key (its time once the hold ends is PROTECTED ticks younger). Returns
        the held tokens (0: nothing of `tokens` is cached, or seconds <= 0)."""
        if seconds <= 0 or self.mode == "off":
            return 0
        root = self._root(namespace)
        if root is None:
            return 0
        toks = self._tok(tokens)
        path, m = self._walk(root, toks, len(toks) // self.P)
        if not path:
            return 0
        end, k = path[-1]
        if k < len(end.full):
            end = self._split(end, k)       # stamp exactly the held path
        tick = self._tick()
        stamp, base = tick + PAUSED, tick + (PROTECTED if protect else 0)
        n: Node | None = end
        while n is not None and n.parent is not None:
            if n.time < stamp:
                n.time = stamp
                self._push_leaf(n)
            n = n.parent
        if self.hybrid:
            for w in {id(w): w for w, _ in self._window(end)}.values():
                if w.swa_time < stamp:
                    w.swa_time = stamp
                    self._push_swa(w)
        heapq.heappush(self._holds, (self.clock() + seconds, next(self._hold_seq),
                                     toks[:m], namespace, stamp, base))
        self.counters["held"] += 1
        return m

    def expire_holds(self) -> int:
        """End the holds whose time is up; returns how many ended."""
        holds, now, done = self._holds, self.clock(), 0
        while holds and holds[0][0] <= now:
            _, _, toks, ns, stamp, base = heapq.heappop(holds)
            done += 1
            root = self._root(ns)
            if root is None:
                continue
            for n, _ in self._walk(root, toks, len(toks) // self.P)[0]:
                if n.time == stamp:
                    n.time = base
                    self._push_leaf(n)
                if self.hybrid and n.swa_time == stamp:
                    n.swa_time = base
                    self._push_swa(n)
        return done

    @property
    def num_holds(self) -> int:
        """Holds not yet ended (some may be past their time until the next eviction)."""
        return len(self._holds)

    def evict(self, full: int = 0, swa: int = 0) -> tuple[int, int]:
        self.expire_holds()
        return super().evict(full, swa)
