"""The scheduler and the prefix cache driven without a model: a step schedules, "runs" (each
sampled chunk appends a token that is a fixed function of the sequence so far) and commits.
Enough to reach every page-accounting path, and fast. Imports no torch: the pools are
bookkeeping only (`DualPool(..., allocate=False)`).

Speculative decoding without a model: `drafter(seq, k)` proposes up to k tokens for a
decoding request; the step "verifies" them against the same fixed function (a draft token
is accepted while it equals the token the model would have produced), appends the accepted
ones plus one more, and commits with the rejected positions rolled back, as the engine does.
"""
from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

from mimo.config import SchedulerConfig
from mimo.engine.prefill_planner import PrefillPlanner
from mimo.engine.sampling_params import SamplingParams
from mimo.engine.scheduler import Scheduler
from mimo.engine.sequence import Sequence
from mimo.kvcache.pool.dual_pool import DualPool
from mimo.kvcache.pool.layout import KVLayout, LayerKV
from mimo.kvcache.radix.cache import RadixPrefixCache


def next_token(ids: list[int]) -> int:
    """The harness's "model": the next token of a sequence."""
    return 3 + sum(ids) % 97


def continuation(ids: list[int], n: int) -> list[int]:
    """The n tokens the harness's model would append to `ids`."""
    ids, out = list(ids), []
    for _ in range(n):
        out.append(next_token(ids))
        ids.append(out[-1])
    return out


class Harness:
    def __init__(self, window=6, page=2, full_pages=200, swa_pages=80, chunk=32,
                 admission="reserve", retention="hybrid-output", rebuild=True, swa_layers=3,
                 prefill: PrefillPlanner | None = None, policy="fcfs", cache=True,
                 max_num_seqs=64, length_buckets=None, hybrid=True, num_draft=0,
                 drafter: Callable[[Sequence, int], list[int]] | None = None,
                 layout: KVLayout | None = None, mixed: int | None = None):
        """`layout`: a real model's KV shapes (`shape_layout`; its window wins over
        `window`), else a small hybrid one. `mixed`: the budget while requests decode
        (default: `chunk`)."""
        full = (LayerKV(1, 2, 2),)
        swa = (LayerKV(1, 2, 2),) * swa_layers
        if layout is None:
            layout = (KVLayout(full, swa, window, 4) if hybrid
                      else KVLayout(full + swa, (), window, 4, hybrid=False))
        self.pool = DualPool(layout, full_pages, swa_pages, page, allocate=False)
        self.cache = RadixPrefixCache(self.pool, retention, rebuild=rebuild) if cache else None
        cfg = SchedulerConfig(max_num_batched_tokens=chunk, admission=admission, policy=policy,
                              max_mixed_batched_tokens=chunk if mixed is None else mixed,
                              max_num_seqs=max_num_seqs, length_buckets=length_buckets)
        self.sched = Scheduler(cfg, self.pool, self.cache, num_draft=num_draft, prefill=prefill)
        self.drafter = drafter
        self.prefill_tokens = 0     # prompt (and resumed) tokens computed so far
        self._ids = itertools.count()

    def add(self, prompt, max_tokens=1) -> Sequence:
        seq = Sequence(next(self._ids), list(prompt),
                       SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                       frozenset())
        assert self.sched.fits_empty_pool(seq), "the engine would refuse this request"
        self.sched.add(seq)
        return seq

    def step(self):
        drafts = None
        if self.drafter is not None:
            drafts = {s: self.drafter(s, self.sched.num_draft) for s in self.sched.running
                      if not s.in_prefill}
        chunks = self.sched.schedule(drafts)
        self.prefill_tokens += sum(c.n for c in chunks if c.start < c.seq.prefill_end)
        kept = {}
        for c in chunks:
            if not c.sample:
                continue
            if not c.draft:
                c.seq.append(next_token(c.seq.all_ids))
                continue
            want = continuation(c.seq.all_ids, len(c.draft) + 1)
            accepted = next((i for i, (d, w) in enumerate(zip(c.draft, want)) if d != w),
                            len(c.draft))
            emitted = 0
            for t in want[:accepted + 1]:
                c.seq.append(t)
                emitted += 1
                if c.seq.finish_reason is not None:
                    break
            kept[c] = emitted
        self.sched.commit(chunks, kept)
        self.check()
        return chunks

    def run(self, until=None, limit=10_000) -> None:
        for _ in range(limit):
            if until is not None and until():
                return
            if not self.sched.has_work():
                assert until is None, "idle before the condition held"
                return
            self.step()
        raise AssertionError("did not finish")

    def check(self) -> None:
        self.pool.check_integrity()
        if self.cache is not None:
            self.cache.check_integrity()
            check_lock_rule(self.sched, self.cache)

    def check_idle(self) -> None:
        """Nothing runs or waits, and only the cache holds pages (none in use)."""
        assert not self.sched.has_work()
        assert self.pool.num_live_seqs == 0
        for a in (self.pool.full.allocator, self.pool.swa.allocator):
            assert a.num_in_use == 0, f"{a.name}: {a.num_in_use} pages leaked"


def check_lock_rule(sched, cache) -> None:
    """The rule written in scheduler.py: a running request's lock pins only pages in its own
    tables. Full: the lock's path is a prefix of its table. SWA: the window before the
    node's end, but for the leading pages the request decoded past (`kv.unpinned`), which
    are no longer in its table; so `pinned_outside` (which `need` adds) is 0. And every SWA
    lock count in the tree is one of these pins: nothing else holds SWA between steps."""
    pins: Counter = Counter()
    for seq in sched.running:
        kv, node = seq.kv, seq.kv.node
        if node is None:
            continue
        path, n = [], node
        while n.parent is not None:
            path[:0] = n.full
            n = n.parent
        assert kv.full_pages[:len(path)] == path, \
            f"request {seq.id}: its lock pins full pages that are not in its table"
        if kv.lock_window and cache.pool.hybrid:
            for g, p in cache.tree.window_of(node):
                held = g < len(kv.swa_pages) and kv.swa_pages[g] == p
                if g >= kv.unpinned:
                    assert held, f"request {seq.id}: its lock pins SWA page {p} (logical " \
                                 f"{g}) that is not in its table"
                    pins[p] += 1
                else:
                    assert not held, f"request {seq.id}: unpinned SWA page {p} it still reads"
            assert cache.pinned_outside(kv) == (0, 0)
    if cache.pool.hybrid:
        locked = Counter({n.swa[i]: c for n in cache.tree.paths.nodes()
                          for i, c in n.swa_lock.items()})
        assert locked == pins, f"SWA lock counts {dict(locked)} != running requests' pins {dict(pins)}"
