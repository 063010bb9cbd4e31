"""The scheduler and the prefix cache driven without a model: a step schedules, "runs" (each
sampled chunk appends a token that is a fixed function of the sequence so far) and commits.
Enough to reach every page-accounting path, and fast."""
from __future__ import annotations

import itertools

from mimo.config import SchedulerConfig
from mimo.engine.prefill_step import PrefillStep
from mimo.engine.sampling_params import SamplingParams
from mimo.engine.scheduler import Scheduler
from mimo.engine.sequence import Sequence
from mimo.kvcache.dual_pool import DualPool
from mimo.kvcache.layout import KVLayout, LayerKV
from mimo.kvcache.prefix_cache import PrefixCache


class Harness:
    def __init__(self, window=6, page=2, full_pages=200, swa_pages=80, chunk=32,
                 admission="reserve", retention="hybrid-output", rebuild=True, swa_layers=3,
                 prefill: PrefillStep | None = None, policy="fcfs"):
        layout = KVLayout((LayerKV(1, 2, 2),), (LayerKV(1, 2, 2),) * swa_layers, window, 4)
        self.pool = DualPool(layout, full_pages, swa_pages, page, allocate=False)
        self.cache = PrefixCache(self.pool, retention, rebuild=rebuild)
        cfg = SchedulerConfig(max_num_batched_tokens=chunk, admission=admission, policy=policy)
        self.sched = Scheduler(cfg, self.pool, self.cache, prefill=prefill)
        self._ids = itertools.count()

    def add(self, prompt, max_tokens=1) -> Sequence:
        seq = Sequence(next(self._ids), list(prompt),
                       SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                       frozenset())
        self.sched.add(seq)
        return seq

    def step(self):
        chunks = self.sched.schedule(None)
        for c in chunks:
            if c.sample:
                c.seq.append(3 + sum(c.seq.all_ids) % 97)
        self.sched.commit(chunks)
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
        self.cache.check_integrity()
        check_lock_rule(self.sched, self.cache)


def check_lock_rule(sched, cache) -> None:
    """The rule written in scheduler.py: every full page a running request's lock pins is
    in its own table; its SWA lock pins the window before the node's end, and the pages of
    it the table no longer holds are the ones `pinned_outside` reports (and `need` adds)."""
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
            outside = sum(g >= len(kv.swa_pages) or kv.swa_pages[g] != p
                          for g, p in cache.tree.window_of(node))
            assert cache.pinned_outside(kv) == (0, outside)
