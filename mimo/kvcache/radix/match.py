"""The match rules of the SWA-aware radix tree (tree.py has the invariants): the longest
window-safe cached prefix of a request's tokens, or a window rebuild ending further on."""
from __future__ import annotations

from collections.abc import Hashable, Sequence

from .lru import LRU
from .node import NO_SWA, MatchResult, Node
from .paths import Path, Paths
from .retention import window_first_page


class Matcher:
    def __init__(self, paths: Paths, lru: LRU, counters: dict[str, int], enabled: bool,
                 rebuild: int) -> None:
        self.paths, self.lru, self.counters = paths, lru, counters
        self.P, self.W, self.hybrid = paths.P, paths.W, paths.hybrid
        self.enabled = enabled              # mode "off" matches nothing
        self.rebuild = rebuild              # the default receptive field (`match`)

    def match(self, tokens: Sequence[int], namespace: Hashable = None, count: bool = True,
              rebuild: int | None = None) -> MatchResult:
        """Longest window-safe cached prefix of `tokens` (whole pages only). The engine
        passes the prompt without its last token, which it must compute anyway. The match
        node is split so that it ends exactly at `full_len`. `count=False`: a lookup that is
        not a request's admission (kept out of the hit counters).

        `rebuild` (tokens, 0: off; None: the tree's): the model's SWA receptive field,
        (window - 1) times its SWA layers. When the window before the token-equal end E is
        gone, a request can still start about `rebuild` tokens before E
        (`Paths.rebuild_start`) instead of the last window-safe point: it recomputes from
        there to E for the SWA layers only, reading the cached full KV of the whole prefix,
        and the SWA KV it gets for the window before E is exact (each SWA layer widens the
        region its garbage-free input needs by window - 1 tokens; the full layers read
        cached keys, so they widen nothing). Such a match has `full_len` = E > `length`,
        hands over no SWA pages, and is locked with `lock(node, window=False)`."""
        self.counters["matches"] += count
        rebuild = self.rebuild if rebuild is None else rebuild
        root = self.paths.root(namespace)
        if not self.enabled or root is None:
            return MatchResult(0, 0, root)
        P, now = self.P, self.lru.tick()
        path, m, q = self.lookup(root, tokens)
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
                n = self.paths.split(n, take)
            full.extend(n.full)
            done += take
            n.time = now
            self.lru.push_leaf(n)
            node = n
        # A rebuild's SWA is exact from its start + rebuild - (W - 1) (see `rebuild_start`).
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
            for n, i in self.paths.window(node):
                assert n.swa is not None
                res.swa_pages[n.start // P + i] = n.swa[i]
                if n.swa_time != now:
                    n.swa_time = now
                    self.lru.push_swa(n)
        return res

    def _rebuild_beyond(self, m: int, q: int, rebuild: int) -> int:
        """The first page of a rebuild ending at the token-equal end `m` when it starts
        past the last window-safe page `q` (so a match would take it), else 0."""
        if not self.hybrid or rebuild <= 0 or m <= q * self.P:
            return 0
        r = self.paths.rebuild_start(m, rebuild)
        return r if r > q else 0

    def _count_cut(self, path: Path, m: int, length: int) -> None:
        """Why a window cut happened: the window before the token-equal end `m` has a page
        whose SWA was never kept (no checkpoint there in this node's life: a fork nobody
        foresaw) or only pages that SWA-only eviction freed (a checkpoint lost to pressure)."""
        swa = [s for n, k in path for s in (n.swa or [])[:k]]
        never = any(swa[i] == NO_SWA for i in range(window_first_page(m, self.W, self.P),
                                                     m // self.P))
        self.counters["cut_never_kept" if never else "cut_evicted"] += m - length

    def peek(self, tokens: Sequence[int], namespace: Hashable = None,
             rebuild: int | None = None) -> int:
        """The length `match` would return, without splitting, touching or counting: the
        scheduler's estimate of a waiting request's cached tokens."""
        rebuild = self.rebuild if rebuild is None else rebuild
        root = self.paths.root(namespace)
        if not self.enabled or root is None:
            return 0
        _, m, q = self.lookup(root, tokens)
        return (self._rebuild_beyond(m, q, rebuild) or q) * self.P

    def lookup(self, root: Node, tokens: Sequence[int]) -> tuple[Path, int, int]:
        """(path, tokens equal to a cached path, window-safe pages of them): the read-only
        part of a match."""
        toks = self.paths.tok(tokens)
        path, m = self.paths.walk(root, toks, len(toks) // self.P)
        q = m // self.P
        if self.hybrid:
            q = self.paths.safe_pages([p >= 0 for n, k in path for p in (n.swa or [])[:k]], q)
        return path, m, q
