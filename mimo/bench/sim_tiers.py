"""The lower KV tiers in the model-free cache simulator: host memory (L2) and storage (L3).

L1 stays the real radix tree over real page allocators (`cache_sim.CacheSim`). Below it:
- L2 and L3 are byte-budgeted LRU stores of page keys. A page key is the chained identity
  of the prefix up to and including that page (namespace, every token before it, the page's
  own tokens) plus its kind: full-layer KV or SWA KV. Full and SWA pages cost their kind's
  bytes; in `full-kv` there is one kind, holding every layer (SWA layers stored like full
  ones, as HiCache did before it supported SWA and LMCache does under a hybrid allocator).
- L2 is write-back: what L1 evicts goes down to it, a whole leaf's full pages and its live
  SWA pages, and the SWA pages SWA-only eviction frees. It drops its LRU pages.
- L3 is write-through: when a request's KV enters L1, L3 gets the full pages of its cached
  length and the SWA pages of the windows the retention policy keeps (the same points L1
  keeps), and the hit's window (a repair where L3 lacks what L1 holds). Writing a page L3
  holds refreshes it, so L1 and L2 hits keep their prefix alive in L3 (keep-alive).
- A request's hit is the longest window-safe prefix by L1's rule (full KV for [0, L), SWA
  for the window before L), each page from any tier: full KV in L1 with its window in L2 is
  a split hit. The longer of it and L1's own match (which may rebuild a window; the lower
  tiers do not) wins. The pages it loads from L2/L3 are promoted into L1, inserted with a
  window at the hit, and the request proceeds as in L1 alone; the branch point its
  checkpoints use is where its tokens leave every tier. A request that cannot fit in L1
  with the promoted prefix takes L1's own match (the engine caps a hit by what L1 can take).
- Within a tier, pages are written and refreshed deepest first, so a prefix's root is its
  most recent page and LRU eviction cuts a prefix from its end, as the tree evicts leaves.

Ages: a page's birth is when its KV entered a tier while no tier held it; it is carried
while any tier holds the page and forgotten when none does. A hit's age is now minus the
birth of its last page: how long the cache had kept that prefix reusable (the report's
"TTL" argument). Time is the trace's timestamp (seconds) when every request has one, else
the request's index.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..kvcache.radix.node import Node
from ..kvcache.radix.retention import RetentionPolicy, window_pages
from ..kvcache.radix.tree import RadixTree
from .sim_cache import CacheSim
from .sim_tier_store import (
    TIERS,
    TierStore,
    _percentiles,
    chain,
    full_keys,
    namespace_base,
    page_hashes,
    safe_pages,
)


class TierTree(RadixTree):
    """The L1 tree, telling `drop_listeners` which pages leave it, before they are freed:
    listener(node, local indices of full pages, local indices of live SWA pages)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drop_listeners: list[Callable[[Node, list[int], list[int]], None]] = []
        self._end_value: dict[Node, int] = {}   # chain value at a node's end (never moves)
        self.listeners.append(self)

    # ---- TreeListener ----------------------------------------------------------------------
    def inserted(self, tokens, namespace) -> None:
        """(Inserts: the simulator makes them itself.)"""

    def evicted(self, node: Node, full_idx: list[int], swa_idx: list[int]) -> None:
        for f in self.drop_listeners:
            f(node, full_idx, swa_idx)
        if full_idx:                        # the whole node goes (its keys read above)
            self._end_value.pop(node, None)

    def node_keys(self, node: Node) -> list[int]:
        """Full keys of the node's pages."""
        P = self.P
        assert node.parent is not None      # a root holds no pages
        v = chain(self._value_at_end(node.parent),
                  page_hashes(node.tokens, node.start // P, len(node.full), P))
        self._end_value[node] = int(v[-1])
        return full_keys(v)

    def _value_at_end(self, node: Node) -> int:
        up = []
        n = node
        while n.parent is not None and n not in self._end_value:
            up.append(n)
            n = n.parent
        if n.parent is None:
            v = namespace_base(self.paths.namespace_of(n))
        else:
            v = self._end_value[n]
        for n in reversed(up):
            h = page_hashes(n.tokens, n.start // self.P, len(n.full), self.P)
            v = (v + int(h.sum(dtype=np.uint64))) & ((1 << 64) - 1)
            self._end_value[n] = v
        return v

    def l1_view(self, tokens: array, namespace, n_pages: int) -> tuple[int, list[int]]:
        """(pages of `tokens` whose full KV L1 holds, from the start; their SWA pages, < 0
        where none, empty outside hybrid mode), read-only."""
        root = self.paths.root(namespace)
        if root is None:
            return 0, []
        path, m = self.paths.walk(root, tokens, n_pages)
        return m // self.P, [s for n, k in path for s in (n.swa or [])[:k]] if self.hybrid else []


@dataclass(frozen=True)
class HitPoint(RetentionPolicy):
    """The request's policy plus a firm window at a hit served from the lower tiers, cached
    at least that far: how its promoted pages enter L1."""
    point: int = 0

    def cache_len(self, total_len: int, page: int, prompt_len: int | None = None) -> int:
        return max(super().cache_len(total_len, page, prompt_len), min(self.point, total_len))

    def checkpoints(self, total_len, prompt_len, branch_len, page, firm_only=False):
        pts = super().checkpoints(total_len, prompt_len, branch_len, page, firm_only)
        return sorted({*pts, self.point}) if self.point > 0 else pts


@dataclass
class Served:
    """Where one request's hit came from."""
    hit: int = 0                                    # tokens
    tokens: list[int] = field(default_factory=lambda: [0, 0, 0])     # by tier of full KV
    swa_bytes: list[int] = field(default_factory=lambda: [0, 0, 0])  # window read, by tier
    full_bytes: list[int] = field(default_factory=lambda: [0, 0, 0])
    tier: int = 0                                   # deepest tier it read from
    split: bool = False     # a page's window SWA came from another tier than its full KV
    age: float | None = None


class TieredCacheSim(CacheSim):
    """CacheSim with L2 (`l2_budget` bytes) and L3 (`l3_budget` bytes) below L1; the rules
    are in this module's docstring. Policies: the hybrid ones and 'full-kv'."""
    tree_cls = TierTree
    tree: TierTree

    def __init__(self, layout, full_kv, budget: int, policy: str = "hybrid",
                 l2_budget: int = 0, l3_budget: int = 0, **kw):
        super().__init__(layout, full_kv, budget, policy, **kw)
        if self.tree.mode == "off":
            raise ValueError("the lower tiers need a cache: policy 'off' has none")
        P = self.P
        self.page_bytes = (P * self.fb, P * self.sb)
        self.l2 = TierStore("L2", l2_budget, *self.page_bytes)
        self.l3 = TierStore("L3", l3_budget, *self.page_bytes)
        self.l1: dict[int, float] = {}      # full key -> birth, for the pages L1 holds
        self.tree.drop_listeners.append(self._written_back)
        self.now = 0.0
        self.times: list[float] | None = None    # per request (run: the trace's timestamps)
        self.age_unit = "requests"
        self.by_tier = [0, 0, 0]
        self.read_full, self.read_swa = [0, 0, 0], [0, 0, 0]
        self.tier_hits = self.split_hits = 0
        self.ages: list[array] = [array("d") for _ in TIERS]
        self.log: list[Served] | None = None    # per request, when a list (tests)

    # ---- births -----------------------------------------------------------------------
    def _birth(self, key: int) -> float:
        for d in (self.l1, self.l2.pages, self.l3.pages):
            b = d.get(key)
            if b is not None:
                return b
        return self.now

    def _written_back(self, node, full: list[int], swa: list[int]) -> None:
        keys, l1, put, now = self.tree.node_keys(node), self.l1, self.l2.put, self.now
        if not self.l2.budget:
            for i in full:
                l1.pop(keys[i], None)
            return
        s = set(swa)
        for i in sorted({*full, *swa}, reverse=True) if not full else full[::-1]:
            k = keys[i]
            if not full:
                b = l1.get(k)
                put(k | 1, now if b is None else b)
                continue
            b = l1.pop(k, None)
            b = now if b is None else b
            if i in s:
                put(k | 1, b)
            put(k, b)

    # ---- one request ------------------------------------------------------------------
    def request(self, prompt, output_len: int, namespace=None, paused: bool = False,
                now: float | None = None, output=None) -> int:
        if paused or now is not None or output is not None:
            raise ValueError("the tiered replay runs on the trace's clock, without paused "
                             "sessions or given outputs (CacheSim has them)")
        P, tree, W = self.P, self.tree, self.window
        self.now = now = (self.times[self.requests] if self.times is not None
                          else float(self.requests))
        toks, L, T = self._tokens(prompt, output_len)
        m = tree.match(toks[:L - 1], namespace)
        n_look = (L - 1) // P
        keys = full_keys(chain(namespace_base(namespace),
                               page_hashes(toks, 0, len(toks) // P, P)))
        f1, l1swa = tree.l1_view(toks, namespace, n_look)
        l2, l3 = self.l2.pages, self.l3.pages
        fa = f1                             # full KV in some tier, from the start
        while fa < n_look and (keys[fa] in l2 or keys[fa] in l3):
            fa += 1
        h = fa
        if self.hybrid:
            def live(g: int) -> bool:
                return (g < f1 and l1swa[g] >= 0) or (keys[g] | 1) in l2 or (keys[g] | 1) in l3
            h = safe_pages(live, fa, W, P)
        branch = fa * P if fa * P > m.prefix_len else None
        srv, res = Served(), None
        if h * P > m.length:                # the lower tiers serve more than L1
            srv = self._serve(keys, h, f1, l1swa)
            srv.age = now - self._birth(keys[h - 1])
            base = tree.policy
            tree.policy = HitPoint(**base.__dict__, point=h * P)
            try:
                res = self._admit(toks, L, T, m, namespace, start=h, branch=fa * P)
            finally:
                tree.policy = base
            if res is None:                 # L1 cannot take it: L1's own match
                m, srv = tree.match(toks[:L - 1], namespace, count=False), Served()
        if res is None:
            h = m.length // P
            srv.hit = srv.tokens[0] = m.length
            srv.age = now - self._birth(keys[h - 1]) if h else None
            res = self._admit(toks, L, T, m, namespace, branch=branch)
        self._account(srv, L)
        if res is None:
            self.uncached += 1
            return srv.hit
        # What L1 holds of this sequence now (eviction and unlocking may have cut its path).
        l1 = self.l1
        new = [k for k in keys[:tree.l1_view(toks, namespace, len(keys))[0]] if k not in l1]
        for k in new:
            l1[k] = self._birth(k)
        # Write-through: the request's cached length (at least its hit) and kept windows.
        q_end = max(tree.policy.cache_len(T, P, L) // P, h)
        swa: set[int] = set()
        if self.hybrid:
            if srv.tier or not m.rebuild:
                lo, swa = h, set(window_pages(h * P, W, P))
            else:                           # a rebuild computes its SWA exactly from here
                lo = -(-m.swa_exact_from // P)
            swa.update(i for i in tree.keep_pages(T, L, fa * P) if lo <= i < q_end)
        self._write_l3(keys, q_end, swa)
        return srv.hit

    def _serve(self, keys: list[int], h: int, f1: int, l1swa) -> Served:
        """Attribute a hit of h pages served from the tiers (full KV by page, the window's
        SWA by page) and refresh what L2 and L3 serve, deepest first."""
        P = self.P
        srv = Served(hit=h * P)
        l2 = self.l2.pages
        src = [0] * f1 + [1 if keys[g] in l2 else 2 for g in range(f1, h)]
        swa_src = {}
        for g in (window_pages(h * P, self.window, P) if self.hybrid else ()):
            s = keys[g] | 1
            swa_src[g] = 0 if g < f1 and l1swa[g] >= 0 else 1 if s in l2 else 2
        for g in range(h - 1, -1, -1):
            t = swa_src.get(g, 0)
            if t:
                srv.swa_bytes[t] += self.page_bytes[1]
                (self.l2 if t == 1 else self.l3).touch(keys[g] | 1)
            if src[g]:
                srv.full_bytes[src[g]] += self.page_bytes[0]
                (self.l2 if src[g] == 1 else self.l3).touch(keys[g])
            srv.tokens[src[g]] += P
        srv.tier = max(max(src), max(swa_src.values(), default=0))
        srv.split = any(t != src[g] for g, t in swa_src.items())
        return srv

    def _account(self, srv: Served, L: int) -> None:
        self.hit, self.prompt, self.requests = self.hit + srv.hit, self.prompt + L, self.requests + 1
        for t in range(3):
            self.by_tier[t] += srv.tokens[t]
            self.read_full[t] += srv.full_bytes[t]
            self.read_swa[t] += srv.swa_bytes[t]
        self.l2.read += srv.full_bytes[1] + srv.swa_bytes[1]
        self.l3.read += srv.full_bytes[2] + srv.swa_bytes[2]
        self.tier_hits += srv.tier > 0
        self.split_hits += srv.split
        if srv.age is not None:
            self.ages[srv.tier].append(srv.age)
        if self.log is not None:
            self.log.append(srv)

    def _write_l3(self, keys: list[int], upto: int, swa: set[int]) -> None:
        if not self.l3.budget:
            return
        pages, put, birth = self.l3.pages, self.l3.put, self._birth
        for g in range(upto - 1, -1, -1):
            k = keys[g]
            if g in swa:
                if k | 1 in pages:
                    pages.move_to_end(k | 1)
                else:
                    put(k | 1, birth(k))
            if k in pages:
                pages.move_to_end(k)
            else:
                put(k, birth(k))

    # ---- replay and report ------------------------------------------------------------
    def run(self, reqs, progress=None, label: str = "", every_s: float = 5.0,
            check_every: int = 0, leaf_every: int = 0) -> dict:
        stamped = bool(reqs) and all("timestamp" in r for r in reqs)
        self.times = [r["timestamp"] / 1000 for r in reqs] if stamped else None
        self.age_unit = "s" if stamped else "requests"
        out = super().run(reqs, progress, label, every_s, check_every, leaf_every)
        self.check_tiers()
        return out

    def check_tiers(self, l1: bool = False) -> None:
        """Every tier within its budget with its books right; `l1`: also that the births
        kept for L1 name exactly the pages the tree holds (walks the whole tree)."""
        self.l2.check_integrity()
        self.l3.check_integrity()
        if l1:
            held = {k for n in self.tree.paths.nodes() for k in self.tree.node_keys(n)}
            assert held == set(self.l1), "L1 births out of step with the tree"

    def result(self, seconds: float) -> dict:
        out = super().result(seconds)
        hit, prompt = max(self.hit, 1), max(self.prompt, 1)
        lower = sum(self.read_full[1:]) + sum(self.read_swa[1:])
        every = array("d")
        for a in self.ages:
            every.extend(a)
        ages = {t: _percentiles(a) for t, a in [*zip(TIERS, self.ages), ("all", every)]}
        out["tiers"] = {
            "l1_bytes": self.budget, "l2_bytes": self.l2.budget, "l3_bytes": self.l3.budget,
            "total_bytes": self.budget + self.l2.budget + self.l3.budget,
            "hit_rate_by_tier": {t: round(x / prompt, 4) for t, x in zip(TIERS, self.by_tier)},
            "hit_tokens_by_tier": dict(zip(TIERS, self.by_tier)),
            "full_bytes_read": dict(zip(TIERS[1:], self.read_full[1:])),
            "swa_bytes_read": dict(zip(TIERS[1:], self.read_swa[1:])),
            "bytes_moved_per_reused_token": round(lower / hit, 1),
            "bytes_written_per_prompt_token": {"L2": round(self.l2.written / prompt, 1),
                                               "L3": round(self.l3.written / prompt, 1)},
            "requests_served_below_l1": self.tier_hits, "split_hits": self.split_hits,
            "age_unit": self.age_unit, "hit_age": ages,
            "L2": self.l2.stats(), "L3": self.l3.stats()}
        return out
