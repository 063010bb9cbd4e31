"""Random insert / match / lock / unlock / evict sequences against the brute-force model.

Requests run like the engine runs them: match a prompt, lock, allocate pages for the rest
(evicting first), release some SWA pages as window release would, then insert (or abort)
and unlock. After every step: the tree's integrity check, the allocators' accounting
(every page in use is held by a running request or by a locked tree node), and the tree's
contents against the model. Under the keep-everything policy the model predicts inserts
exactly; evictions are the tree's choice, so there the model checks that only unlocked KV
went, that eviction stopped only when nothing was left to evict, and then adopts the result.
"""
from __future__ import annotations

from helpers.radix_model import brute_insert, brute_match, flatten, key, needed_pages
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mimo.kvcache.pool.allocator import IN_USE, OutOfPages, PageAllocator
from mimo.kvcache.radix.retention import RetentionPolicy
from mimo.kvcache.radix.tree import RadixTree

# Prompts share prefixes often: a cut of one of a few base sequences (which themselves
# share prefixes of several lengths) plus a short random tail.
_B0 = [i % 5 for i in range(24)]
BASES = [_B0, _B0[:10] + [7] * 14, _B0[:4] + [8, 9] * 10]
tokens = st.builds(lambda b, cut, tail: (BASES[b][:cut] + tail) or [0],
                   st.integers(0, 2), st.integers(0, 24),
                   st.lists(st.integers(0, 2), max_size=4))


class TreeMachine(RuleBasedStateMachine):
    mode, policy = "hybrid", RetentionPolicy(keep_all=True)
    exact = True                # the model predicts inserts exactly (keep-all policy only)

    @initialize(page=st.sampled_from([1, 2, 3]), window=st.integers(1, 7),
                full_cap=st.integers(4, 40), swa_cap=st.integers(4, 40),
                swa_layers=st.integers(0, 3))
    def setup(self, page, window, full_cap, swa_cap, swa_layers):
        self.P, self.W, self.hybrid = page, window, self.mode == "hybrid"
        self.fa = PageAllocator(full_cap, "full")
        self.sa = PageAllocator(swa_cap, "swa")
        self.unmapped: list[int] = []
        # Window rebuild: the receptive field of 0 (off) to 3 SWA layers; with it, leaves a
        # rebuild can reach may lose their windows.
        self.R = swa_layers * (window - 1)
        self.tree = RadixTree(page, window, self.fa, self.sa if self.hybrid else None,
                              self.policy, self.mode, unmap=self.unmapped.extend,
                              rebuild=self.R)
        self.flat: dict = {}
        self.reqs: list[dict] = []
        self.history: list = []

    # ---- helpers -----------------------------------------------------------------------
    def check_match(self, toks, ns, m, rebuild=0):
        want = brute_match(self.flat, ns, toks, self.P, self.W, self.hybrid)
        P, W = self.P, self.W
        full_len = want[0]
        if rebuild and self.hybrid and want[1] > want[0]:
            # A rebuild starts early enough that SWA comes out exact (from start + rebuild
            # - (W - 1)) on the first page of the window before the token-equal end.
            start = ((want[1] - W + 1) // P * P - (rebuild - (W - 1))) // P * P
            if start > want[0]:
                want, full_len = (start, want[1]), want[1]
        assert (m.length, m.prefix_len) == want, (m.length, m.prefix_len, want, rebuild)
        assert m.full_len == full_len and m.rebuild == (full_len > m.length)
        assert m.full_pages == [self.flat[key(ns, toks, i, P)][0] for i in range(full_len // P)]
        q = m.length // P
        if m.rebuild:
            assert m.swa_pages == [None] * q
        elif self.hybrid:
            need = needed_pages(m.length, self.W, self.P)
            for i in range(q):
                s = self.flat[key(ns, toks, i, self.P)][1]
                assert m.swa_pages[i] == (s if i in need else None)
                assert i not in need or s >= 0

    def own_pages(self):
        f = [p for r in self.reqs for p in r["own_full"]]
        s = [p for r in self.reqs for p in r["own_swa"]]
        return f, s

    # ---- rules -------------------------------------------------------------------------
    @rule(toks=tokens, ns=st.sampled_from([None, "img"]))
    def match_only(self, toks, ns):
        self.check_match(toks, ns, self.tree.match(toks, ns), self.R if self.hybrid else 0)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), more=st.lists(st.integers(0, 2), max_size=3))
    def again(self, data, more):
        """A whole request for a prompt seen before, maybe extended: retries and next
        turns, where released windows cut matches and recomputation revives them."""
        toks, ns = data.draw(st.sampled_from(self.history))
        self.request(toks + more, ns, data)

    @rule(toks=tokens, ns=st.sampled_from([None, "img"]), data=st.data())
    def request(self, toks, ns, data):
        """A request that starts and finishes before the next one."""
        n = len(self.reqs)
        self.start(toks, ns, data)
        if len(self.reqs) > n:
            self.finish(data, len(self.reqs) - 1)

    @rule(toks=tokens, ns=st.sampled_from([None, "img"]), data=st.data())
    def start(self, toks, ns, data):
        self.history.append((toks, ns))
        # Match with the tree's receptive field (None) or without rebuild.
        rebuild = data.draw(st.sampled_from([None, 0]))
        m = self.tree.match(toks, ns, rebuild=rebuild)
        rebuild = (self.R if self.hybrid else 0) if rebuild is None else rebuild
        self.check_match(toks, ns, m, rebuild)
        window = not m.rebuild
        self.tree.lock(m.node, window)
        P, q0, qf = self.P, m.length // self.P, m.full_len // self.P
        n = -(-len(toks) // P)
        need_s = n - q0 if self.hybrid else 0
        short_f, short_s = n - qf - self.fa.num_free, need_s - self.sa.num_free
        if short_f > 0 or short_s > 0:
            self.evict_checked(max(short_f, 0), max(short_s, 0))
        try:
            fp = self.fa.alloc(n - qf)
            try:
                sp = self.sa.alloc(need_s)
            except OutOfPages:
                self.fa.free(fp)
                raise
        except OutOfPages:
            self.tree.unlock(m.node, window)
            self.flat = flatten(self.tree)      # (a rebuild's dead-end leaf is trimmed)
            return
        swa = list(m.swa_pages) + list(sp) if self.hybrid else None
        own_swa = set(sp)
        if self.hybrid and sp:      # window release: drop some of the request's SWA pages
            drop = data.draw(st.lists(st.sampled_from(sp), unique=True, max_size=len(sp)))
            if m.rebuild:           # and a rebuild's inexact ones (RadixPrefixCache._offered_swa)
                exact = -(-(m.length + rebuild - (self.W - 1)) // P)
                drop = sorted(set(drop) | {swa[i] for i in range(q0, min(exact, n))})
            self.sa.free(drop)
            own_swa -= set(drop)
            swa = [None if s in drop else s for s in swa]
        self.reqs.append(dict(toks=toks, ns=ns, m=m, full=m.full_pages + fp, swa=swa,
                              own_full=set(fp), own_swa=own_swa, window=window))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data, which=None):
        if which is None:
            which = data.draw(st.integers(0, len(self.reqs) - 1))
        r = self.reqs.pop(which)
        lo = (len(r["full"]) - 1) * self.P + 1     # KV may end inside the last page
        toks = r["toks"][:data.draw(st.integers(lo, len(r["toks"])))]
        before = dict((k, list(v)) for k, v in self.flat.items())
        res = self.tree.insert(toks, r["full"], r["swa"], r["ns"],
                               prompt_len=data.draw(st.integers(1, 30)))
        # Every page the request owned is either taken or handed back, never both; the
        # tree's own pages (from the match) are never handed back.
        assert set(res.dup_full) <= r["own_full"] and set(res.dup_swa) <= r["own_swa"]
        assert len(set(res.dup_full)) == len(res.dup_full)
        if self.exact:
            want = brute_insert(self.flat, r["ns"], toks, r["full"], r["swa"], self.P, self.W,
                                self.hybrid)
            assert sorted(res.dup_full) == sorted(want[0]), (res.dup_full, want[0])
            assert sorted(res.dup_swa) == sorted(want[1]), (res.dup_swa, want[1])
            assert sorted(res.remap) == sorted(want[2])
        else:   # inserting only adds: entries kept, SWA only revived; new pages are caller's
            self.flat = flatten(self.tree)
            for k, (f, s) in before.items():
                assert self.flat[k][0] == f and (s < 0 or self.flat[k][1] == s)
        tree_f = {v[0] for v in self.flat.values()}
        tree_s = {v[1] for v in self.flat.values() if v[1] >= 0}
        assert r["own_full"] - set(res.dup_full) <= tree_f
        assert r["own_swa"] - set(res.dup_swa) <= tree_s
        self.fa.free(res.dup_full)
        self.sa.free(res.dup_swa)
        self.tree.unlock(r["m"].node, r["window"])
        if not r["window"]:
            self.flat = flatten(self.tree)  # unlocking a rebuild's dead-end leaf trims it

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def abort(self, data):
        r = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.fa.free(sorted(r["own_full"]))
        self.sa.free(sorted(r["own_swa"]))
        self.tree.unlock(r["m"].node, r["window"])
        self.flat = flatten(self.tree)      # unlocking a rebuild's dead-end leaf trims it

    @rule(nf=st.integers(0, 8), ns_=st.integers(0, 8))
    def evict(self, nf, ns_):
        self.evict_checked(nf, ns_)

    def evict_checked(self, nf, ns_):
        before = self.flat
        self.unmapped.clear()
        got_f, got_s = self.tree.evict(nf, ns_)
        after = flatten(self.tree)
        lost_f = {v[0] for v in before.values()} - {v[0] for v in after.values()}
        lost_s = ({v[1] for v in before.values() if v[1] >= 0}
                  - {v[1] for v in after.values() if v[1] >= 0})
        assert (got_f, got_s) == (len(lost_f), len(lost_s))
        for k, (f, s) in after.items():     # nothing appears, nothing moves
            assert before[k][0] == f and (s < 0 or before[k][1] == s)
        if self.hybrid:     # every full page that lost its SWA was reported to unmap
            full_of = {v[1]: v[0] for v in before.values() if v[1] >= 0}
            assert sorted(self.unmapped) == sorted(full_of[s] for s in lost_s)
        # The lazy heaps reach every evictable page without being rebuilt.
        assert self.tree.counters["reheaps"] == 0, "evict lost track of evictable pages"
        if got_f < nf:
            assert self.fa.num_evictable == 0, "stopped evicting full KV with some unlocked"
        if got_s < ns_ and self.hybrid:
            assert self.sa.num_evictable == 0 and self.fa.num_evictable == 0
        self.flat = after
        for r in self.reqs:     # running requests keep their matched prefix and window
            if r["m"].rebuild:  # (a rebuild: the full KV up to where it stops matching)
                end = r["m"].full_len
                assert self.tree.match(r["toks"][:end], r["ns"], count=False).prefix_len == end
                continue
            self.check_match(r["toks"][:r["m"].length], r["ns"], self.tree.match(
                r["toks"][:r["m"].length], r["ns"], rebuild=0))
            assert self.tree.match(r["toks"][:r["m"].length], r["ns"],
                                   rebuild=0).length == r["m"].length

    # ---- invariants --------------------------------------------------------------------
    @invariant()
    def integrity(self):
        if not hasattr(self, "tree"):
            return
        self.tree.check_integrity()
        assert flatten(self.tree) == self.flat
        own_f, own_s = self.own_pages()
        locked_f = {v[0] for v in self.flat.values()
                    if self.fa._state[v[0]] == IN_USE}
        assert self.fa.num_in_use == len(own_f) + len(locked_f), "full page leaked"
        if self.hybrid:
            locked_s = {v[1] for v in self.flat.values()
                        if v[1] >= 0 and self.sa._state[v[1]] == IN_USE}
            assert self.sa.num_in_use == len(own_s) + len(locked_s), "SWA page leaked"
            assert not set(own_s) & {v[1] for v in self.flat.values()}
        assert not set(own_f) & {v[0] for v in self.flat.values()}

    def teardown(self):
        if not hasattr(self, "tree"):
            return
        while self.reqs:        # everything returns: the pools end full of free pages
            r = self.reqs.pop()
            self.fa.free(sorted(r["own_full"]))
            self.sa.free(sorted(r["own_swa"]))
            self.tree.unlock(r["m"].node, r["window"])
        self.tree.evict(self.fa.capacity, self.sa.capacity)
        self.tree.check_integrity()
        assert self.fa.num_free == self.fa.capacity and self.sa.num_free == self.sa.capacity


class FullKVMachine(TreeMachine):
    mode = "full-kv"


class PolicyMachine(TreeMachine):
    """The real retention policy (checkpoints only): the model cannot predict which SWA
    pages an insert keeps, so it checks that inserts only add, and matches stay exact."""
    policy, exact = RetentionPolicy(align=0, dense_every=4, dense_upto=8), False


class PromptsMachine(PolicyMachine):
    """Aligned checkpoints, prompts only, speculative grid: the bench's kind of policy."""
    policy = RetentionPolicy(align=6, output=False, dense_every=6)


SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestHybrid = TreeMachine.TestCase
TestHybrid.settings = SETTINGS
TestFullKV = FullKVMachine.TestCase
TestFullKV.settings = settings(SETTINGS, max_examples=60)
TestPolicy = PolicyMachine.TestCase
TestPolicy.settings = settings(SETTINGS, max_examples=100)
TestPrompts = PromptsMachine.TestCase
TestPrompts.settings = settings(SETTINGS, max_examples=60)
