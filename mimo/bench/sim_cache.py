"""Model-free replay of a request trace through the real radix tree and page allocators.

Trace model (Mooncake format: `hash_ids` name 512-token prompt blocks, equal ids at equal
positions are a reusable prefix): prompt block j holds the token ids
hash_ids[j] * 512 + [0, 512), the last block cut to `input_length`; the request's
`output_length` generated tokens get ids unique to it (negative, so they never collide
with a prompt), since a later prompt that continues a conversation names its blocks with
new hash ids. Requests are replayed one after another in trace order, each the way the
engine drives the tree: match the prompt (less its last token; with window rebuild, as the
engine matches), lock, allocate pages for the rest (evicting first), keep the SWA pages the
retention policy names plus the last window (what window release leaves; after a rebuild
only exact ones), insert prompt + output, free the duplicates, unlock.
Timestamps are not replayed: no two requests hold locks at once, so the whole budget is
cache, as between bursts on a real server. They only drive the tree's clock for sessions
paused in a tool call (`request(paused=True, now=)`, held for `hold_s`: kvcache/radix/hold.py).

The hit rate is token-weighted: matched prompt tokens / prompt tokens. `size_swa_share`
picks the SWA pool's share of a budget from a sizing replay.
"""
from __future__ import annotations

import json
import time
from array import array
from pathlib import Path

from ..kvcache.pool.allocator import PageAllocator
from ..kvcache.pool.layout import KVLayout
from ..kvcache.radix.retention import POLICIES, RetentionPolicy, window_first_page, window_pages
from ..kvcache.radix.tree import RadixTree

BLOCK = 512


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_trace(path, limit: int | None = None) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace not found: {path}")
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def prompt_tokens(hash_ids, input_length: int, block: int = BLOCK) -> array:
    toks = array("q")
    for h in hash_ids:
        toks.extend(range(h * block, h * block + block))
    del toks[input_length:]
    return toks


def ideal_hit_rates(reqs, block: int = BLOCK) -> dict:
    """Infinite cache, full KV everywhere: a prompt reuses its longest block prefix seen
    before. Block-weighted (the trace README's "ideal hit rate") and token-weighted (the
    same unit as the replay's hit rate)."""
    seen: set = set()
    hit_b = tot_b = hit_t = tot_t = 0
    for r in reqs:
        h, n = r["hash_ids"], r["input_length"]
        k = 0
        key: tuple[int, ...] = ()
        for x in h:
            key = key + (x,)
            if key not in seen:
                break
            k += 1
        key = ()
        for x in h:
            key = key + (x,)
            seen.add(key)
        hit_b, tot_b = hit_b + k, tot_b + len(h)
        hit_t, tot_t = hit_t + min(k * block, n), tot_t + n
    return {"ideal_hit_rate": hit_t / max(tot_t, 1), "ideal_block_hit_rate": hit_b / max(tot_b, 1)}


def estimate_swa_share(reqs, layout: KVLayout, policy: RetentionPolicy, page: int = 16,
                       align: int = BLOCK, output: bool | None = None) -> float:
    """SWA pool share at which both pools fill together: the bytes of SWA windows over the
    bytes of everything the policy would insert, replaying the trace with unlimited memory
    (a request inserts what its ideal hit does not cover: its new full pages and the
    windows of its firm checkpoints past that hit). Cached data ages out of both pools at
    about the same rate, so the cache holds them in that proportion."""
    over = {"align": align} if output is None else {"align": align, "output": output}
    pol = RetentionPolicy(**{**policy.__dict__, **over})
    seen: set = set()
    full = swa = 0
    for r in reqs:
        h, L = r["hash_ids"], r["input_length"]
        T = L + max(r["output_length"] - 1, 0)
        k = 0
        key: tuple[int, ...] = ()
        for x in h:
            key += (x,)
            if key not in seen:
                break
            k += 1
        key = ()
        for x in h:
            key += (x,)
            seen.add(key)
        hit = min(k * BLOCK, L - 1) // page * page
        full += max(pol.cache_len(T, page, L) - hit, 0)
        if pol.keep_all:
            swa += max(pol.cache_len(T, page, L) - hit, 0)
            continue
        cps = [c for c in pol.checkpoints(T, L, hit, page, firm_only=True) if c > hit]
        swa += len(pol.keep_pages(cps, layout.window, page)) * page
    fb, sb = layout.full_bytes_per_token, layout.swa_bytes_per_token
    return swa * sb / max(swa * sb + full * fb, 1)


def size_swa_share(reqs, layout: KVLayout, full_kv: KVLayout, budget: int,
                   policy: RetentionPolicy, page: int = 16, align: int = BLOCK,
                   chunk: int = 2048, output: bool | None = None, rebuild: bool = True,
                   leaf_every: int = 10, progress=None) -> dict:
    """The SWA pool share for `budget`: room for the tail window of every sequence the cache
    holds at its peak, plus what one running request holds (a prefill chunk's SWA and a
    branch window). Returns {"swa_share", "seed_share", "peak_leaves"}.

    Why this size: the tree keeps a window at each cached sequence's end (a leaf), where its
    next turn continues. A pool that cannot hold them all must drop short leaves whole, full
    KV included, and free long leaves' windows (each reuse then recomputes a receptive
    field): the hit rate falls off a cliff just below this size. SWA above it holds branch,
    superseded and speculative windows, whose loss a rebuild or a later firm window mostly
    makes up, while the same bytes of full KV keep more sequences. The fill-together share
    (`estimate_swa_share`) sizes SWA as if every window it ever kept lived as long as full
    KV; the tree demotes superseded ends, so that share is larger than the cache uses.

    Only where prompts alone are cached. With outputs cached (or every page kept) the fill
    share is returned: the next turn continues at the output end (a leaf) if it resends the
    output, or at the prompt end inside the sequence if it does not, which no leaf count can
    tell (docs/kvcache_measurements.md: on a trace that does not, the leaves' windows alone
    cost hit rate).

    How: replay the trace at the fill-together share (the seed), count leaves every
    `leaf_every` requests, take the peak, scale it with the full pool if that ever filled (a
    smaller SWA share leaves a larger full pool, which holds proportionally more sequences)
    and solve share * budget = leaves(share) * window bytes + one request's transient.
    Should the seed be the smaller, its replay could not hold every leaf: replay once more
    at the result."""
    seed = estimate_swa_share(reqs, layout, policy, page, align, output)
    if policy.keep_all or (policy.output if output is None else output):
        return {"swa_share": seed, "seed_share": seed, "peak_leaves": None}
    sb, P = layout.swa_bytes_per_token, page
    win = _cdiv(layout.window - 1, P) * P * sb          # a leaf's tail window, page-aligned
    first = seed
    k: float                # bytes of the peak leaves' windows (scaled below)
    for _ in range(2):
        sim = CacheSim(layout, full_kv, budget, "hybrid", page_size=page, align=align,
                       swa_share=seed, chunk=chunk, retention=policy, output=output,
                       rebuild=rebuild)
        sim.run(reqs, progress=progress, every_s=10.0, leaf_every=leaf_every,
                label=f"sizing SWA for {budget / 2**30:g}GiB at {seed:.4f}")
        k, transient = sim.peak_leaves * win, sim.chunk_pages * P * sb + win
        if sim.full_short:      # a full pool that filled holds more sequences when larger
            k /= 1 - seed       # (leaf windows per unit of full share)
            share = (k + transient) / (budget + k)
        else:   # it held the whole trace: a larger one would buy nothing, SWA keeps the rest
            share = max((k + transient) / budget, seed)
        share = min(share, 0.95)    # (CacheSim needs a full pool)
        if share <= seed:
            break
        seed = share
    return {"swa_share": share, "seed_share": first, "peak_leaves": sim.peak_leaves}


class CacheSim:
    """One policy at one budget. `policy`: a name in POLICIES, 'full-kv' or 'off'. The lower
    tiers (L2, L3) are `sim_tiers.TieredCacheSim`'s."""
    tree_cls = RadixTree        # TieredCacheSim's tree reports what L1 evicts

    def __init__(self, layout: KVLayout, full_kv: KVLayout, budget: int, policy: str = "hybrid",
                 page_size: int = 16, align: int = BLOCK, swa_share: float = 0.2,
                 chunk: int = 2048, retention: RetentionPolicy | None = None,
                 output: bool | None = None, rebuild: bool = True, hold_s: float = 0.0):
        P = self.P = page_size
        self.name, self.budget, self.window = policy, budget, layout.window
        # While prefilling, a request also holds one chunk's SWA pages (released per chunk).
        self.chunk_pages = _cdiv(chunk, P) + 1 if chunk else 0
        if retention is None:
            retention = POLICIES.get(policy, RetentionPolicy())
        over = {"align": align} if output is None else {"align": align, "output": output}
        self.policy = RetentionPolicy(**{**retention.__dict__, **over})
        if policy in ("full-kv", "off"):
            self.fb, self.sb = full_kv.full_bytes_per_token, 0
            full_pages, swa_pages, mode = budget // (P * self.fb), 0, policy
        else:
            self.fb, self.sb = layout.full_bytes_per_token, layout.swa_bytes_per_token
            swa_pages = int(budget * swa_share) // (P * self.sb)
            full_pages = (budget - swa_pages * P * self.sb) // (P * self.fb)
            mode = "hybrid"
        self.fa = PageAllocator(full_pages, "full")
        self.sa = PageAllocator(swa_pages, "swa") if mode == "hybrid" else None   # None: not hybrid
        self.hybrid = mode == "hybrid"
        # Window rebuild (RadixTree.match): the SWA receptive field, 0 when off.
        self.rebuild = layout.swa_receptive_field if self.hybrid and rebuild else 0
        self.tree = self.tree_cls(P, layout.window, self.fa, self.sa, self.policy, mode,
                              rebuild=self.rebuild)
        self.hold_s, self.now = hold_s, 0.0
        self.tree.clock = lambda: self.now
        self._out_id = 0
        self.hit = self.prompt = self.requests = self.uncached = self.peak_leaves = 0
        self.full_short = 0     # requests that found the full pool full (evicted for it)

    def _tokens(self, prompt, output_len: int) -> tuple[array, int, int]:
        """(prompt + generated ids, prompt length, tokens with KV)."""
        L = len(prompt)
        T = L + max(output_len - 1, 0)          # the last sampled token has no KV yet
        toks = array("q", prompt)
        toks.extend(range(-self._out_id - 1, -self._out_id - 1 - (T - L), -1))
        self._out_id += T - L
        return toks, L, T

    def request(self, prompt, output_len: int, namespace=None, paused: bool = False,
                now: float | None = None, output=None) -> int:
        """Replay one request; returns its cached prompt tokens. `paused`: its answer ended
        in a tool call (held for `hold_s` seconds of `now`, the request's time). `output`:
        its generated ids (default: ids unique to it), for a trace whose next turn resends
        them."""
        if now is not None:
            self.now = now
        toks, L, T = self._tokens(prompt, output_len)
        if output is not None:
            if len(output) < T - L:
                raise ValueError(f"{len(output)} output ids for {output_len} output tokens")
            toks[L:] = array("q", list(output)[:T - L])
        m = self.tree.match(toks[:L - 1], namespace)
        self.hit, self.prompt, self.requests = self.hit + m.length, self.prompt + L, self.requests + 1
        if self.tree.mode != "off":
            if self._admit(toks, L, T, m, namespace) is None:
                self.uncached += 1              # bigger than the whole cache: run uncached
            elif paused and self.hold_s > 0:
                self.tree.hold(toks[:T], namespace, self.hold_s)
        return m.length

    def _admit(self, toks, L: int, T: int, m, namespace=None, start: int | None = None,
               branch: int | None = None):
        """Lock, make room, allocate, insert, free the duplicates, unlock; None if it cannot
        fit. `start`, `branch` (`sim_tiers`): where a hit from the lower tiers ends (pages; the
        request loads the window before it) and where its tokens leave every tier."""
        P, tree = self.P, self.tree
        window = not m.rebuild
        tree.lock(m.node, window)
        q0 = m.length // P if start is None else start
        qf, n = m.full_len // P, _cdiv(T, P)
        keep_new: list[int] = []
        if self.hybrid:
            keep = tree.keep_pages(T, L, m.prefix_len if branch is None else branch)
            keep.update(window_pages(n * P, self.window, P))   # the last window stays live
            # A rebuild's SWA is exact only from swa_exact_from on (RadixTree.match).
            lo = (_cdiv(m.swa_exact_from, P) if start is None
                  else window_first_page(start * P, self.window, P))
            keep_new = sorted(i for i in keep if lo <= i < n)
        transient = min(self.chunk_pages, n - q0) if self.hybrid else 0
        short_f = n - qf - self.fa.num_free
        short_s = len(keep_new) + transient - self.sa.num_free if self.sa is not None else 0
        self.full_short += short_f > 0
        if short_f > 0 or short_s > 0:
            tree.evict(max(short_f, 0), max(short_s, 0))
        if (self.fa.num_free < n - qf
                or (self.sa is not None and self.sa.num_free < len(keep_new) + transient)):
            tree.unlock(m.node, window)
            return None
        fp = self.fa.alloc(n - qf)
        swa = None
        if self.sa is not None:
            swa = list(m.swa_pages) + [None] * (n - q0) if start is None else [None] * n
            for i, s in zip(keep_new, self.sa.alloc(len(keep_new))):
                swa[i] = s
        res = tree.insert(toks, m.full_pages + fp, swa, namespace, prompt_len=L,
                          branch_len=branch)
        self.fa.free(res.dup_full)
        if self.sa is not None:
            self.sa.free(res.dup_swa)
        tree.unlock(m.node, window)
        return res

    def run(self, reqs, progress=None, label: str = "", every_s: float = 5.0,
            check_every: int = 0, leaf_every: int = 0) -> dict:
        """Replay `reqs`. `leaf_every`: count the tree's leaves after every that many
        requests, keeping the largest count in `peak_leaves` (`size_swa_share`)."""
        t0 = last = time.perf_counter()
        for i, r in enumerate(reqs):
            self.request(prompt_tokens(r["hash_ids"], r["input_length"]), r["output_length"])
            if check_every and (i + 1) % check_every == 0:
                self.tree.check_integrity()
            if leaf_every and (i + 1) % leaf_every == 0:
                self.peak_leaves = max(self.peak_leaves, self.tree.num_leaves())
            now = time.perf_counter()
            if progress is not None and now - last >= every_s:
                last = now
                print(f"[cache-sim] {label}: {i + 1}/{len(reqs)} requests, hit rate "
                      f"{self.hit / max(self.prompt, 1):.4f}, {now - t0:.0f}s",
                      file=progress, flush=True)
        self.tree.check_integrity()
        return self.result(time.perf_counter() - t0)

    def result(self, seconds: float) -> dict:
        st = self.tree.stats() if self.tree.mode != "off" else {}
        P = self.P
        out = {"policy": self.name, "kv_budget_bytes": self.budget,
               "hit_rate": round(self.hit / max(self.prompt, 1), 4),
               "hit_tokens": self.hit, "prompt_tokens": self.prompt,
               "requests": self.requests, "uncached_requests": self.uncached,
               "retention": dict(self.policy.__dict__) if self.hybrid else
               {"align": self.policy.align, "output": self.policy.output},
               "seconds": round(seconds, 2),
               "full_pages": self.fa.capacity, "swa_pages": self.sa.capacity if self.sa else 0,
               "full_bytes": self.fa.capacity * P * self.fb,
               "swa_bytes": (self.sa.capacity if self.sa else 0) * P * self.sb}
        if st:
            out["window_cut_rate"] = round(
                (st["prefix_tokens"] - st["matched_tokens"]) / max(self.prompt, 1), 4)
            # Split by cause: forks where no checkpoint was ever kept (retention could only
            # help by guessing) and checkpoints SWA-only eviction freed (pool pressure).
            out["window_cut_never_kept_rate"] = round(st["cut_never_kept"] / max(self.prompt, 1), 4)
            out["window_cut_evicted_rate"] = round(st["cut_evicted"] / max(self.prompt, 1), 4)
            # Prompt tokens served by window rebuilds beyond the last kept window (in hit_rate).
            out["rebuilt_rate"] = round(st["rebuilt_tokens"] / max(self.prompt, 1), 4)
            out["tree"] = {k: st[k] for k in ("nodes", "cached_tokens", "swa_live_pages",
                                              "swa_tombstones", "evicted_full", "evicted_swa",
                                              "tombstoned_swa", "revived_swa")}
        return out
