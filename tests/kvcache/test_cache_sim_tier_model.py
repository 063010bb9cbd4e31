"""The simulator's lower tiers (L2, L3) against a plain reference model, hit for hit.

The reference is written from the rules in `mimo.bench.sim_tiers`'s docstring alone: page
keys are (kind, namespace, tuple of every token up to the page's end), L2 and L3 are
OrderedDicts with byte budgets, presence is sets. L1 is the real radix tree in both: the
reference reads what L1 holds from the tree before each request, and hears L1's evictions
through the tree's drop_listeners, naming the pages itself.
"""
from __future__ import annotations

import random
from array import array
from collections import OrderedDict
from pathlib import Path

import pytest

from mimo.bench.sim_cache import CacheSim, ideal_hit_rates, load_trace, prompt_tokens
from mimo.bench.sim_tiers import TieredCacheSim, chain, full_keys, namespace_base, page_hashes
from mimo.kvcache.pool.layout import KVLayout, LayerKV, shape_layout
from mimo.kvcache.radix.retention import RetentionPolicy, window_pages

P, W = 4, 8
LAYOUT = KVLayout((LayerKV(1, 4, 4),), (LayerKV(1, 4, 4),) * 2, W, 2)      # 16 / 32 B a token
FULL_KV = KVLayout((LayerKV(1, 4, 4),) * 3, (), W, 2, hybrid=False)        # 48 B a token
GiB = 2**30
CONVERSATION = Path(__file__).resolve().parents[2] / "data" / "traces" / "conversation_trace.jsonl"


class Reference:
    """L2/L3 by the book. `check(sim, prompt, out)` runs one request on the simulator and
    compares where its hit came from with what the book says."""

    def __init__(self, sim: TieredCacheSim, l2: int, l3: int):
        self.sim, self.hybrid = sim, sim.hybrid
        self.cost = {"F": P * sim.fb, "S": P * sim.sb}
        self.tiers = {"L2": OrderedDict(), "L3": OrderedDict()}
        self.budget, self.used = {"L2": l2, "L3": l3}, {"L2": 0, "L3": 0}
        self.l1: set = set()
        self.birth: dict = {}
        self.now, self.out_id = 0.0, 0
        sim.tree.drop_listeners.append(self.evicted)

    # -- tiers ---------------------------------------------------------------------------
    def in_any(self, k) -> bool:
        return k in self.l1 or k in self.tiers["L2"] or k in self.tiers["L3"]

    def forget(self, k) -> None:
        if k[0] == "F" and not self.in_any(k):
            self.birth.pop(k, None)

    def put(self, tier, k) -> None:
        d = self.tiers[tier]
        if k in d:
            d.move_to_end(k)
            return
        c = self.cost[k[0]]
        if c > self.budget[tier]:
            return
        while self.used[tier] + c > self.budget[tier]:
            old, _ = d.popitem(last=False)
            self.used[tier] -= self.cost[old[0]]
            self.forget(old)
        d[k] = True
        self.used[tier] += c
        if k[0] == "F":
            self.birth.setdefault(k, self.now)

    # -- L1 ------------------------------------------------------------------------------
    @staticmethod
    def path_tokens(node) -> list:
        parts = []
        while node.parent is not None:
            parts.append(list(node.tokens))
            node = node.parent
        return [t for p in reversed(parts) for t in p]

    def node_pages(self, node):
        toks, first = self.path_tokens(node), node.start // P
        return [(("F", None, tuple(toks[:(first + i + 1) * P])),
                 ("S", None, tuple(toks[:(first + i + 1) * P]))) for i in range(len(node.full))]

    def evicted(self, node, full, swa) -> None:
        keys = self.node_pages(node)
        for i in sorted(set(full) | set(swa), reverse=True):
            f, s = keys[i]
            if i in swa:
                self.l1.discard(s)
                self.put("L2", s)
            if i in full:
                self.l1.discard(f)
                self.put("L2", f)
                self.forget(f)

    def snapshot(self) -> None:
        self.l1 = set()
        for n in self.sim.tree.paths.nodes():
            for i, (f, s) in enumerate(self.node_pages(n)):
                self.l1.add(f)
                self.birth.setdefault(f, self.now)
                if self.hybrid and n.swa[i] >= 0:
                    self.l1.add(s)

    # -- one request ---------------------------------------------------------------------
    def check(self, prompt, out_len: int) -> None:
        sim = self.sim
        self.now = float(sim.requests)
        L = len(prompt)
        T = L + max(out_len - 1, 0)
        toks = list(prompt) + [-self.out_id - 1 - j for j in range(T - L)]
        self.out_id += T - L

        def F(g):
            return ("F", None, tuple(toks[:(g + 1) * P]))

        def S(g):
            return ("S", None, tuple(toks[:(g + 1) * P]))

        def safe(live, q):
            for p in range(q, 0, -1):
                if all(live(i) for i in window_pages(p * P, W, P)):
                    return p
            return 0

        n_look = (L - 1) // P
        L2, L3 = self.tiers["L2"], self.tiers["L3"]
        f1 = 0
        while f1 < n_look and F(f1) in self.l1:
            f1 += 1
        fa = f1
        while fa < n_look and (F(fa) in L2 or F(fa) in L3):
            fa += 1
        if self.hybrid:
            l1_hit = safe(lambda i: S(i) in self.l1, f1)
            h = safe(lambda i: self.in_any(S(i)), fa)
        else:
            l1_hit, h = f1, fa

        def tier(k):
            return 0 if k in self.l1 else 1 if k in L2 else 2

        tokens, swa_bytes, deepest, split = [0, 0, 0], [0, 0, 0], 0, False
        if h > l1_hit:
            full_src = [tier(F(g)) for g in range(h)]
            win = {g: tier(S(g)) for g in (window_pages(h * P, W, P) if self.hybrid else ())}
            for g in range(h - 1, -1, -1):            # refreshed deepest first
                if win.get(g):
                    self.tiers[("L2", "L3")[win[g] - 1]].move_to_end(S(g))
                if full_src[g]:
                    self.tiers[("L2", "L3")[full_src[g] - 1]].move_to_end(F(g))
            for t in full_src:
                tokens[t] += P
            for t in win.values():
                swa_bytes[t] += self.cost["S"] * (t > 0)
            deepest = max([*full_src, *win.values()])
            split = any(t != full_src[g] for g, t in win.items())
        else:
            h = l1_hit
            tokens[0] = h * P
        age = self.now - self.birth[F(h - 1)] if h else None

        got = sim.request(prompt, out_len)
        srv = sim.log[-1]
        assert (got, srv.tokens, srv.swa_bytes[1:], srv.tier, srv.split, srv.age) == (
            h * P, tokens, swa_bytes[1:], deepest, split, age), sim.requests

        self.snapshot()
        # The hit's pages were promoted: L1 alone now serves it.
        assert all(F(g) in self.l1 for g in range(h))
        assert not self.hybrid or all(S(g) in self.l1 for g in window_pages(h * P, W, P))
        pol = sim.policy
        q_end = max(pol.cache_len(T, P, L) // P, h)
        swa = set()
        if self.hybrid:
            keep = (set(range(-(-T // P))) if pol.keep_all else
                    pol.keep_pages(pol.checkpoints(T, L, fa * P, P), W, P))
            swa = set(window_pages(h * P, W, P)) | {g for g in keep if h <= g < q_end}
        for g in range(q_end - 1, -1, -1):
            if g in swa:
                self.put("L3", S(g))
            self.put("L3", F(g))

    def same_tiers(self) -> None:
        """The simulator's L2 and L3 hold the same pages in the same LRU order."""
        for name, store in (("L2", self.sim.l2), ("L3", self.sim.l3)):
            want = []
            for kind, _, toks in self.tiers[name]:
                n = len(toks) // P
                k = full_keys(chain(namespace_base(None),
                                    page_hashes(array("q", toks), 0, n, P)))[-1]
                want.append(k | (kind == "S"))
            assert list(store.pages) == want, name
            assert store.used == self.used[name]


def workload(seed: int, n: int = 160):
    """Chats that continue, fork, repeat and start afresh (three shared system prefixes),
    with tokens unique to each place they were first written, so only the intended prefixes
    are shared."""
    rnd, fresh = random.Random(seed), iter(range(10**6, 10**7))
    systems = [[next(fresh) for _ in range(rnd.randrange(6, 20))] for _ in range(3)]
    past, out = [], []
    for _ in range(n):
        r = rnd.random()
        if past and r < 0.4:
            base = rnd.choice(past)
        elif past and r < 0.65:
            b = rnd.choice(past)
            base = b[:rnd.randrange(1, len(b) + 1)]
        elif past and r < 0.75:
            out.append((list(rnd.choice(past)), rnd.randrange(1, 12)))
            continue
        else:
            base = list(rnd.choice(systems))
        prompt = base + [next(fresh) for _ in range(rnd.randrange(2, 40))]
        prompt = prompt[:120]
        past.append(prompt)
        out.append((prompt, rnd.randrange(1, 12)))
    return out


POLICIES = {
    "hybrid": RetentionPolicy(dense_every=24, output=False),
    "hybrid-output": RetentionPolicy(),
    "full-kv": None,
}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hits_match_the_reference(policy, seed):
    """Small L1 and tiers that all evict: every request's hit length, the tier its full KV
    came from page by page, the SWA bytes each tier served and the hit's age agree with the
    reference, and so do the tiers' contents and LRU order at the end."""
    name = "full-kv" if policy == "full-kv" else "hybrid"
    l1, l2, l3 = (6000, 1500, 12000) if name == "hybrid" else (7000, 3000, 20000)
    sim = TieredCacheSim(LAYOUT, FULL_KV, l1, name, page_size=P, align=P, swa_share=0.5,
                         chunk=8, retention=POLICIES[policy], rebuild=False,
                         l2_budget=l2, l3_budget=l3)
    sim.log = []
    ref = Reference(sim, l2, l3)
    for i, (prompt, out) in enumerate(workload(seed)):
        ref.check(prompt, out)
        if i % 20 == 0:
            sim.tree.check_integrity()
            sim.check_tiers(l1=True)
    ref.same_tiers()
    assert sim.uncached == 0
    sim.tree.check_integrity()
    sim.check_tiers(l1=True)
    # The workload reaches every tier, and the tiers evicted.
    served = [sum(s.tokens[t] for s in sim.log) for t in range(3)]
    assert all(served), served
    assert sim.l2.evicted and sim.l3.evicted and sim.tree.counters["evicted_full"]
    if name == "hybrid":
        assert sim.split_hits and any(s.swa_bytes[1] or s.swa_bytes[2] for s in sim.log)


@pytest.mark.parametrize("policy", ["hybrid", "full-kv"])
def test_zero_budgets_change_nothing(policy):
    """Tiers of 0 bytes: the same hits, request by request, and the same report as L1 alone,
    on the real trace under eviction."""
    reqs = load_trace(CONVERSATION, limit=300)
    hybrid, full_kv = shape_layout("mimo-v2-flash"), shape_layout("mimo-v2-flash",
                                                                  layout="full-kv")
    plain = CacheSim(hybrid, full_kv, 20 * GiB, policy, swa_share=0.15)
    tiered = TieredCacheSim(hybrid, full_kv, 20 * GiB, policy, swa_share=0.15)
    for r in reqs:
        toks = prompt_tokens(r["hash_ids"], r["input_length"])
        assert plain.request(toks, r["output_length"]) == tiered.request(toks,
                                                                         r["output_length"])
    a, b = plain.result(0), tiered.result(0)
    tiers = b.pop("tiers")
    assert a == b
    assert tiers["hit_tokens_by_tier"] == {"L1": a["hit_tokens"], "L2": 0, "L3": 0}
    assert tiers["bytes_moved_per_reused_token"] == 0
    tiered.check_tiers(l1=True)


def continuing_chats(n: int = 40, turns: int = 4, seed: int = 0):
    """Chats whose every turn resends the last prompt and adds whole blocks: every reuse is
    at a prompt end the policy keeps, so with unlimited memory the hybrid hit rate is the
    trace's ideal one exactly."""
    rnd, events = random.Random(seed), []
    for c in range(n):
        t = 4.0 * c
        for k in range(turns):
            events.append((t, c, k))
            t += rnd.uniform(10, 200)
    return [{"timestamp": int(t * 1000), "hash_ids": [1000 * c + j for j in range(2 + 2 * k)],
             "input_length": 512 * (2 + 2 * k), "output_length": 30}
            for t, c, k in sorted(events)]


@pytest.mark.parametrize("policy", ["hybrid", "full-kv"])
def test_huge_tiers_reach_the_ideal_hit_rate(policy):
    """An L1 that holds about one chat turn: alone it serves almost nothing; with L2 and L3
    that hold everything the hit rate is the ideal one, served from below L1, and the hits'
    ages (trace seconds) reach back across the chats' pauses."""
    reqs = continuing_chats()
    ideal = ideal_hit_rates(reqs)["ideal_hit_rate"]
    hybrid, full_kv = shape_layout("mimo-v2-flash"), shape_layout("mimo-v2-flash",
                                                                  layout="full-kv")
    l1 = 2 * GiB if policy == "full-kv" else GiB
    alone = CacheSim(hybrid, full_kv, l1, policy, swa_share=0.3, chunk=256).run(reqs)
    sim = TieredCacheSim(hybrid, full_kv, l1, policy, swa_share=0.3, chunk=256,
                         l2_budget=64 * GiB, l3_budget=2**40)
    res = sim.run(reqs, check_every=20)
    tiers = res["tiers"]
    assert res["hit_tokens"] == round(ideal * res["prompt_tokens"])
    assert alone["hit_rate"] < 0.5 * ideal and res["uncached_requests"] == 0
    assert sum(tiers["hit_tokens_by_tier"].values()) == res["hit_tokens"]
    assert tiers["hit_tokens_by_tier"]["L2"] > tiers["hit_tokens_by_tier"]["L1"]
    assert tiers["age_unit"] == "s" and tiers["hit_age"]["L2"]["max"] > 100
    sim.check_tiers(l1=True)


def test_split_hit_full_in_l1_window_in_l2():
    """A window freed alone from L1 goes down to L2; the next request with that prefix
    reads its full KV from L1 and only the window from L2, and L1 is window-safe there
    again afterwards."""
    hybrid, full_kv = shape_layout("mimo-v2-flash"), shape_layout("mimo-v2-flash",
                                                                  layout="full-kv")
    sim = TieredCacheSim(hybrid, full_kv, 64 * GiB, "hybrid", swa_share=0.3, rebuild=False,
                         retention=RetentionPolicy(dense_every=512, output=False),
                         l2_budget=GiB)
    sim.log = []
    a = prompt_tokens([0, 1, 2, 3, 4], 2348)            # windows at 512, 1024, 1536, 2048
    sim.request(a, 5)
    tree = sim.tree
    m = tree.match(a[:2048], count=False)
    tree.lock(m.node)                                   # the 2048 window stays
    assert tree.evict(0, 24) == (0, 24)                 # 8 pages at each of 512, 1024, 1536
    tree.unlock(m.node)
    win = len(window_pages(1536, 128, 16))
    assert sim.l2.swa_pages == 3 * win and sim.l2.used == 3 * win * 16 * hybrid.swa_bytes_per_token
    b = prompt_tokens([0, 1, 2, 7, 8], 2400)            # shares 1536 tokens with a
    assert tree.peek(b[:2399]) == 0                     # L1 alone: the window is gone
    assert sim.request(b, 5) == 1536
    srv = sim.log[-1]
    assert srv.tokens == [1536, 0, 0] and srv.tier == 1 and srv.split
    assert srv.swa_bytes[1] == win * 16 * hybrid.swa_bytes_per_token and not srv.full_bytes[1]
    assert tree.peek(b[:1537]) == 1536
    tree.check_integrity()
    sim.check_tiers(l1=True)

