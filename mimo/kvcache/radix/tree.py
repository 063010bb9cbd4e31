"""SWA-aware radix tree over page-aligned token keys (DESIGN.md section 4).

Each node holds a segment of whole pages: its tokens, one full page per page of tokens and
one SWA page per page, or a tombstone where it has none (NO_SWA: never kept; EVICTED_SWA:
freed by SWA-only eviction; either way the full KV stays so the prefix still serves longer
matches). Keys live under a per-namespace root (media hashes, cache salt): equal tokens in
different namespaces never share KV.

Invariants (all checked by `check_integrity`):
- a page is held by at most one node; a held page is IN_USE in its allocator while a lock
  covers it and EVICTABLE (parked) otherwise; the tree is the only one that parks pages;
- full locks cover a locked node and its ancestors (`lock_ref`); SWA locks cover only the
  window before a locked node's end (`swa_lock`), so SWA outside a running request's window
  can still be freed; and only while the request reads it: once decoding has moved past a
  page of that window, `unpin` lets go of it;
- every leaf's end is reachable (window-safe): insert trims to the last safe point, SWA
  eviction never frees a protected leaf's tail window, evicting a leaf trims its parent.
  Relaxed with window rebuild: a leaf longer than a receptive field may lose its window
  (`evict._protects`), and one under a rebuild lock or an `unpin`ned lock may end in
  a dead window (unlocking trims it);
- a node's end never changes once created: splitting makes a new node for the *prefix*, so
  references held in `MatchResult.node` stay valid.

SWA priorities (the SWA LRU order): a window's time is its last use as a match end. Two
kinds start handicapped by SPECULATIVE, so they only hold SWA room nothing else wants
until a match ends at them: windows kept only by the policy's dense grid, and a leaf's
tail window once a longer request extends that path (the conversation moved on: later
turns match the new end; the old one is only a fallback for forks). But the windows a
running request's prefill chunks leave keep their write time until it ends (then those
not its checkpoints are demoted): else its later chunks evict them before idle windows.

Modes: 'hybrid' (SWA pool, window-safe matching), 'full-kv' (the pre-SWA baseline: one pool
holding every layer, every cached prefix reusable) and 'off' (no caching). Files: lock.py
(locks), evict.py (eviction, integrity), hold.py (paused sessions), node.py.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Protocol

import numpy as np

from ..pool.allocator import PageAllocator
from .hold import HoldMixin
from .node import NO_SWA, PROTECTED, SPECULATIVE, InsertResult, MatchResult, Node  # noqa: F401
from .retention import RetentionPolicy, window_first_page

MODES = ("hybrid", "full-kv", "off")


class TreeListener(Protocol):
    """Told what enters and leaves the tree, on the thread that changes it."""
    def inserted(self, tokens, namespace: Hashable) -> None:
        """After an insert: the path equal to `tokens` holds what it will serve now."""

    def evicted(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        """Just before eviction frees these local pages of `node` (its keys still valid)."""


class RadixTree(HoldMixin):     # HoldMixin builds on LockMixin, EvictMixin, TreeCore
    def __init__(self, page_size: int, window: int, full_alloc: PageAllocator,
                 swa_alloc: PageAllocator | None = None, policy: RetentionPolicy | None = None,
                 mode: str = "hybrid", unmap: Callable[[list[int]], None] | None = None,
                 rebuild: int = 0):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if mode == "hybrid" and swa_alloc is None:
            raise ValueError("hybrid mode needs an SWA allocator")
        self.P, self.W, self.mode = page_size, window, mode
        self.hybrid = mode == "hybrid"
        # The SWA receptive field (tokens) its users rebuild windows with, 0: no rebuild
        # (`match`). Besides the default for matches, it decides which leaves may end where
        # their window is gone (see the invariants above and `evict.py`).
        self.rebuild = rebuild if self.hybrid else 0
        self.full_alloc, self.swa_alloc = full_alloc, swa_alloc
        self.policy = policy or RetentionPolicy()
        self.unmap = unmap      # told which full pages lost their SWA (DualPool.full_to_swa)
        self._roots: dict[Hashable, Node] = {}
        # Which pages the tree holds: a page passed to insert is handed back exactly when
        # the tree does not hold it afterwards, whatever the caller's tokens cover.
        self._own_f = np.zeros(full_alloc.capacity, dtype=bool)
        self._own_s = np.zeros(self._swa_pool.capacity if self.hybrid else 0, dtype=bool)
        self._clock = 0
        self._seq = itertools.count()           # heap tie-breaker
        self._leaf_heap: list = []              # (time, seq, node): whole-node LRU
        self._swa_heap: list = []               # (swa_time, seq, node): SWA-only LRU
        self._heap_cap = 65536                  # compact a heap that grows past this
        self._holds, self._hold_seq = [], itertools.count()     # (hold.py)
        # Called with (node, local full pages, local SWA pages) just before eviction frees
        # them, while their KV is still intact: a lower tier copies them down (write-back).
        self._evict_slot: Callable[[Node, list[int], list[int]], None] | None = None
        # Observers of what the tree holds beside that slot (the router's cache publishing,
        # engine/cache_mirror.py): told of every insert and, after the slot, every eviction.
        self.listeners: list[TreeListener] = []
        self.counters = dict(matches=0, matched_tokens=0, prefix_tokens=0, evicted_full=0,
                             evicted_swa=0, tombstoned_swa=0, revived_swa=0, held=0,
                             cut_never_kept=0, cut_evicted=0, rebuilt_tokens=0, reheaps=0)

    @property
    def on_evict(self) -> Callable[[Node, list[int], list[int]], None] | None:
        return self._fan_evict if self.listeners else self._evict_slot

    @on_evict.setter
    def on_evict(self, fn: Callable[[Node, list[int], list[int]], None] | None) -> None:
        self._evict_slot = fn

    def _fan_evict(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        if self._evict_slot is not None:
            self._evict_slot(node, full_idx, swa_idx)
        for li in self.listeners:
            li.evicted(node, full_idx, swa_idx)

    def owns_full(self, page: int) -> bool:
        """Whether the tree holds this full page (a request must never free it)."""
        return bool(self._own_f[page])

    def owns_swa(self, page: int) -> bool:
        return self.hybrid and bool(self._own_s[page])

    # ---- match -------------------------------------------------------------------------
    def match(self, tokens, namespace: Hashable = None, count: bool = True,
              rebuild: int | None = None) -> MatchResult:
        """Longest window-safe cached prefix of `tokens` (whole pages only). The engine
        passes the prompt without its last token, which it must compute anyway. The match
        node is split so that it ends exactly at `full_len`. `count=False`: a lookup that is
        not a request's admission (kept out of the hit counters).

        `rebuild` (tokens, 0: off; None: the tree's): the model's SWA receptive field,
        (window - 1) times its SWA layers. When the window before the token-equal end E is
        gone, a request can still start about `rebuild` tokens before E (`_rebuild_start`)
        instead of the last window-safe point: it recomputes from there to E for the SWA
        layers only, reading the cached full KV of the whole prefix, and the SWA KV it gets
        for the window before E is exact (each SWA layer widens the region its garbage-free
        input needs by window - 1 tokens; the full layers read cached keys, so they widen
        nothing). Such a match has `full_len` = E > `length`, hands over no SWA pages, and
        is locked with `lock(node, window=False)`."""
        self.counters["matches"] += count
        rebuild = self.rebuild if rebuild is None else rebuild
        root = self._root(namespace)
        if self.mode == "off" or root is None:
            return MatchResult(0, 0, root)
        P, now = self.P, self._tick()
        path, m, q = self._lookup(root, tokens)
        q_full = q
        r = self._rebuild_beyond(m, q, rebuild)
        if r:
            self.counters["rebuilt_tokens"] += (r - q) * P * count
            q, q_full = r, m // P
        if self.hybrid and count and m > q * P:
            self._count_cut(path, m, q * P)     # before the splits below reshape `path`
        node, done, full = root, 0, []
        for n, k in path:
            if done == q_full:
                break
            take = min(k, q_full - done)
            if take < len(n.full):
                n = self._split(n, take)
            full.extend(n.full)
            done += take
            n.time = now
            self._push_leaf(n)
            node = n
        # A rebuild's SWA is exact from its start + rebuild - (W - 1) (see `_rebuild_start`).
        exact = q * P + (rebuild - (self.W - 1) if q_full > q else 0)
        res = MatchResult(q * P, m, node, full, full_len=q_full * P, swa_exact_from=exact)
        self.counters["matched_tokens"] += q * P * count
        self.counters["prefix_tokens"] += m * count
        if self.hybrid:
            res.swa_first = window_first_page(q * P, self.W, P)
            res.swa_pages = [None] * q
            if res.rebuild:
                res.swa_first = q           # the request computes all its SWA from q on
                return res
            for n, i in self._window(node):
                res.swa_pages[n.start // P + i] = n.swa[i]
                if n.swa_time != now:
                    n.swa_time = now
                    self._push_swa(n)
        return res

    def _rebuild_beyond(self, m: int, q: int, rebuild: int) -> int:
        """The first page of a rebuild ending at the token-equal end `m` when it starts
        past the last window-safe page `q` (so a match would take it), else 0."""
        if not self.hybrid or rebuild <= 0 or m <= q * self.P:
            return 0
        r = self._rebuild_start(m, rebuild)
        return r if r > q else 0

    def _rebuild_start(self, end: int, rebuild: int) -> int:
        """First page of a rebuild ending at `end` (0: none). Its SWA KV is exact from
        start + rebuild - (W - 1) on; the start is chosen so that this is no later than the
        first page of the window before `end`, so the whole window can be kept."""
        first = window_first_page(end, self.W, self.P) * self.P
        return max((first - (rebuild - (self.W - 1))) // self.P, 0)

    def _count_cut(self, path, m: int, length: int) -> None:
        """Why a window cut happened: the window before the token-equal end `m` has a page
        whose SWA was never kept (no checkpoint there in this node's life: a fork nobody
        foresaw) or only pages that SWA-only eviction freed (a checkpoint lost to pressure)."""
        swa = [s for n, k in path for s in n.swa[:k]]
        never = any(swa[i] == NO_SWA for i in range(window_first_page(m, self.W, self.P),
                                                     m // self.P))
        self.counters["cut_never_kept" if never else "cut_evicted"] += m - length

    def peek(self, tokens, namespace: Hashable = None, rebuild: int | None = None) -> int:
        """The length `match` would return, without splitting, touching or counting: the
        scheduler's estimate of a waiting request's cached tokens."""
        rebuild = self.rebuild if rebuild is None else rebuild
        root = self._root(namespace)
        if self.mode == "off" or root is None:
            return 0
        _, m, q = self._lookup(root, tokens)
        return (self._rebuild_beyond(m, q, rebuild) or q) * self.P

    def _lookup(self, root: Node, tokens) -> tuple[list, int, int]:
        """(path, tokens equal to a cached path, window-safe pages of them): the read-only
        part of a match."""
        toks = self._tok(tokens)
        path, m = self._walk(root, toks, len(toks) // self.P)
        q = m // self.P
        if self.hybrid:
            q = self._safe_pages([p >= 0 for n, k in path for p in n.swa[:k]], q)
        return path, m, q

    def path_pages(self, tokens, namespace: Hashable = None) -> tuple[list[int], list[int]]:
        """(full pages, SWA pages) along the cached path equal to `tokens` (whole pages), SWA
        entries < 0 where tombstoned (NO_SWA / EVICTED_SWA; full-kv mode: all NO_SWA).
        Read-only: no split, no touch, no count. The pages stay the tree's."""
        root = self._root(namespace)
        if self.mode == "off" or root is None:
            return [], []
        toks = self._tok(tokens)
        path, _ = self._walk(root, toks, len(toks) // self.P)
        full = [p for n, k in path for p in n.full[:k]]
        swa = ([s for n, k in path for s in n.swa[:k]] if self.hybrid else [NO_SWA] * len(full))
        return full, swa

    def path_nodes(self, tokens, namespace: Hashable = None) -> list[tuple[Node, int]]:
        """(node, pages of it on the path) along the cached path equal to `tokens`."""
        root = self._root(namespace)
        if self.mode == "off" or root is None:
            return []
        toks = self._tok(tokens)
        return self._walk(root, toks, len(toks) // self.P)[0]

    def namespace_of(self, root: Node) -> Hashable:
        """The namespace a root node stands for."""
        for ns, r in self._roots.items():
            if r is root:
                return ns
        raise KeyError("not a root of this tree")

    # ---- insert ------------------------------------------------------------------------
    def checkpoints(self, total_len: int, prompt_len: int | None, branch_len: int) -> list[int]:
        return self.policy.checkpoints(total_len, prompt_len, branch_len, self.P)

    def keep_pages(self, total_len: int, prompt_len: int | None, branch_len: int) -> set[int]:
        """Logical pages whose SWA a running request must not release: window release
        skips them so insert can keep them (branch_len: `MatchResult.prefix_len`)."""
        if self.policy.keep_all:
            return set(range(-(-total_len // self.P)))
        return self.policy.keep_pages(self.checkpoints(total_len, prompt_len, branch_len),
                                      self.W, self.P)

    def insert(self, tokens, full_pages: list[int], swa_pages=None, namespace: Hashable = None,
               prompt_len: int | None = None, revive: bool = True,
               branch_len: int | None = None, protect: bool = False) -> InsertResult:
        """Hand a finished (or preempted) request's pages to the tree.

        `full_pages[i]` / `swa_pages[i]` hold the KV of tokens [i*P, (i+1)*P) (released SWA:
        None or NO_SWA). Afterwards each page passed is the tree's or listed in `dup_*` for
        the caller to free, never both; the caller then unlocks its match node. Kept: pages
        up to the policy's cached end (cut back to the last window-safe point), SWA only on
        its checkpoint windows; recomputed tombstones are revived (`remap`: a full->SWA map
        must follow), not with `revive=False` (a running request could not lock them).
        `branch_len`: where the request left the cached path at admission (default: where
        `tokens` leave it now). `protect`: a session's KV, stamped PROTECTED ticks younger."""
        P = self.P
        if len(full_pages) > -(-len(tokens) // P):
            raise ValueError(f"{len(full_pages)} pages for {len(tokens)} tokens: pass the "
                             "tokens whose KV the pages hold")
        swa_pages = list(swa_pages or []) + [None] * (len(full_pages) - len(swa_pages or []))
        caller_swa = [s for s in swa_pages if s is not None and s >= 0]
        if self.mode == "off":
            return InsertResult(list(full_pages), caller_swa, [], 0)
        now, toks = self._tick() + (PROTECTED if protect else 0), self._tok(tokens)
        n = min(len(full_pages), len(toks) // P)
        root = self._root(namespace, create=True)
        assert root is not None             # create=True
        path, m = self._walk(root, toks, n)
        mq = m // P
        q_end = self.policy.cache_len(len(toks), P, prompt_len) // P
        cps_branch = m if branch_len is None else branch_len
        cps = self.checkpoints(len(toks), prompt_len, cps_branch)
        running = not revive        # a sync: the request goes on computing this path
        keep, firm = set[int](), set[int]()      # stay empty without SWA pools
        if self.hybrid:
            keep = (set(range(q_end)) if self.policy.keep_all
                    else self.policy.keep_pages(cps, self.W, P))
            firm = (keep if self.policy.keep_all else self.policy.keep_pages(
                self.policy.checkpoints(len(toks), prompt_len, cps_branch, P, firm_only=True),
                self.W, P))
            tree_swa = [s for nd, k in path for s in nd.swa[:k]]
            live = [(i < mq and tree_swa[i] >= 0)
                    or ((revive or i >= mq) and i in keep
                        and swa_pages[i] is not None and swa_pages[i] >= 0)
                    for i in range(q_end)]
            q_end = self._safe_pages(live, q_end)
        remap, revived_nodes = [], []
        base = 0
        for nd, k in path:                  # the part already cached: maybe revive SWA
            nd.time = now
            self._push_leaf(nd)
            if (self.hybrid and not running and nd.start >= cps_branch and nd.swa
                    and not any(base + i in firm for i in range(k))):
                # Its own chunk-end window (see SWA priorities), none of its checkpoints.
                nd.swa_time = min(nd.swa_time, now - SPECULATIVE)
                self._push_swa(nd)
            for i in range(k):
                g = base + i
                s = swa_pages[g]
                if not self.hybrid or not revive or s is None or s < 0:
                    continue
                if nd.swa[i] < 0 and g in keep:
                    nd.swa[i] = s
                    self._swa_pool.park([s])
                    self._own_s[s] = True
                    self.counters["revived_swa"] += 1
                    if full_pages[g] != nd.full[i]:
                        remap.append((nd.full[i], s))
                    revived_nodes.append((nd, g))
            base += k
        for nd, g in revived_nodes:
            if g in firm:
                nd.swa_time = now
            self._push_swa(nd)
        if q_end > mq:                      # the new part: new nodes split at checkpoints
            self._add_new(root, path, toks, full_pages, swa_pages, keep, firm, cps, mq, q_end,
                          cps_branch, prompt_len, running, now)
        for li in self.listeners:
            li.inserted(toks, namespace)
        return InsertResult([p for p, o in zip(full_pages, self._own_f[list(full_pages)]) if not o],
                            [s for s, o in zip(caller_swa, self._own_s[caller_swa]) if not o]
                            if self.hybrid else caller_swa, remap, max(q_end, mq) * P)

    def _add_new(self, root: Node, path, toks, full_pages, swa_pages, keep, firm, cps, mq: int,
                 q_end: int, cps_branch: int, prompt_len: int | None, running: bool,
                 now: int) -> None:
        """insert's new part: pages [mq, q_end) as new nodes split at the checkpoints."""
        P = self.P
        parent = root
        if path:
            last, k = path[-1]
            parent = self._split(last, k) if k < len(last.full) else last
            if (parent is last and not last.children and self.hybrid
                    and not (running and last.end > cps_branch)):
                # A conversation continued past its cached end: later turns will match
                # the new end; the old window is only a fallback for forks now. Unless
                # that end is this sequence's own prompt end (a running request that
                # inserted its prompt now adds its output): then it is firm.
                own_prompt = (self.policy.prompt and prompt_len is not None
                              and last.end in self.policy.prompt_points(prompt_len, P))
                last.swa_time = now if own_prompt else now - SPECULATIVE
                # Its new time needs its own heap entry (the window below may not
                # reach into it: with W = 1 a window lies past the node's end).
                self._push_swa(last)
                # No longer a leaf, it protects no tail window: the nodes holding that
                # window may have left the SWA heap while protected.
                self._push_window(last)
        bounds = sorted({c // P for c in cps if mq < c // P < q_end} | {q_end})
        lo = mq
        for hi in bounds:
            swa = None
            if self.hybrid:
                swa = [swa_pages[i] if (i in keep and swa_pages[i] is not None
                                        and swa_pages[i] >= 0) else NO_SWA
                       for i in range(lo, hi)]
            nd = Node(parent, toks[lo * P:hi * P], list(full_pages[lo:hi]), swa, lo * P, now)
            parent.children[tuple(nd.tokens[:P])] = nd
            self.full_alloc.park(nd.full)
            self._own_f[nd.full] = True
            if swa is not None:
                live_s = [s for s in swa if s >= 0]
                self._swa_pool.park(live_s)
                self._own_s[live_s] = True
                if not any(i in firm for i in range(lo, hi)):
                    nd.swa_time = now - SPECULATIVE   # older than anything firm
                self._push_swa(nd)
            parent, lo = nd, hi
        self._push_leaf(parent)
