"""Continuous batching with chunked prefill. Bookkeeping only: never imports the model.

Each step: every running request in decode gets its one token, then prefill chunks (running
requests first, then newly admitted ones in queue order) fill the rest of the token budget.

Admission reserves each request's worst case. Full pool: pages for prompt + max_tokens. SWA
pool: every running request's steady window (window + one page), plus one step's transient
prefill pages, shared by all (a prefill chunk briefly holds window + chunk; the excess is
released at the end of its step). So decode tokens can always grow, at least one prefill
chunk fits every step, nothing deadlocks and no request dies mid-generation; a request that
does not fit waits until running ones finish and free their pages.

Speculative decoding (`num_draft` > 0): a decoding request's chunk is its last token plus up
to `num_draft` draft tokens, all verified in the step. Drafts are cut so that every token a
step can emit fits in max_tokens, hence the full reservation is unchanged; the steady SWA
reservation grows to window + num_draft (a verify chunk holds the window behind its last
token plus the drafts). After verification `commit` keeps the accepted positions' KV and
frees the pages past them; SWA release only follows the accepted length, so a rollback never
needs SWA KV that was already released.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..config import SchedulerConfig
from ..kvcache.dual_pool import DualPool
from ..kvcache.layout import swa_steady_pages, swa_transient_pages
from .policy import WaitingPolicy, make_policy
from .sequence import Sequence, Status


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int          # first position computed this step
    n: int              # tokens computed this step
    sample: bool        # this chunk ends at the last known token: sample the next one
    draft: list[int] = field(default_factory=list)  # speculative tokens after it (its last rows)
    kept: int | None = None   # set after verification: leading positions whose KV stays (n if None)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: DualPool, cache=None, num_draft: int = 0):
        self.cfg = cfg
        self.num_draft = num_draft
        self.pool = pool
        self.cache = cache          # PrefixCache or None
        opts = {"aging_per_second": cfg.aging_per_second} if cfg.policy == "compute-aware" else {}
        self.waiting: WaitingPolicy = make_policy(cfg.policy, buckets=cfg.length_buckets, **opts)
        self.running: list[Sequence] = []
        self.clock = time.monotonic

    # ---- capacity -------------------------------------------------------------------
    def need(self, seq: Sequence) -> tuple[int, int]:
        """(full pages, steady SWA pages) the request may hold between steps."""
        P = self.pool.page_size
        full = _cdiv(seq.max_len, P)
        swa = (swa_steady_pages(self.pool.window + self.num_draft, P, seq.max_len)
               if self.pool.hybrid else 0)
        return full, swa

    @property
    def _transient(self) -> int:
        if not self.pool.hybrid:
            return 0
        return swa_transient_pages(self.cfg.max_num_batched_tokens, self.pool.page_size)

    def fits_empty_pool(self, seq: Sequence) -> bool:
        f, s = self.need(seq)
        return (f <= self.pool.full.allocator.capacity
                and s + self._transient <= self.pool.swa.allocator.capacity)

    def _can_admit(self, seq: Sequence, held: int = 0) -> bool:
        """`held`: full pages the request already holds (a locked prefix-cache match)."""
        f, s = self.need(seq)
        outstanding_full = sum(max(0, self.need(r)[0] - len(r.kv.full_pages)) for r in self.running)
        fa = self.pool.full.allocator
        steady_swa = sum(self.need(r)[1] for r in self.running)
        return (fa.num_free + fa.num_evictable - outstanding_full >= f - held
                and steady_swa + s + self._transient <= self.pool.swa.allocator.capacity)

    # ---- queue ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.push(seq, self.clock())

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: dict | None = None) -> list[ScheduledChunk]:
        """`drafts`: {sequence in decode: draft tokens} (speculative decoding), or None."""
        budget = self.cfg.max_num_batched_tokens
        out: list[ScheduledChunk] = []
        # Every decode gets its own token before any draft: drafts share what is left.
        spare = budget - sum(not s.in_prefill for s in self.running)
        for seq in self.running:
            if not seq.in_prefill and budget > 0:
                d = drafts.get(seq, []) if drafts else []
                # A step emits at most len(d) + 1 tokens: never more than max_tokens allows.
                d = d[:max(0, min(self.num_draft, spare, seq.max_len - seq.num_tokens - 1))]
                spare -= len(d)
                out.append(self._chunk(seq, 1 + len(d), d))
                budget -= 1 + len(d)
        for seq in self.running:
            if seq.in_prefill and budget > 0:
                n = self._fit(seq, min(len(seq.prompt_ids) - seq.num_computed, budget))
                if n:
                    out.append(self._chunk(seq, n))
                    budget -= n
        out += self._admit(budget)
        return out

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        """New requests in policy order (see mimo/engine/policy.py for the head-of-line rule);
        one prefill batch never mixes length buckets."""
        out: list[ScheduledChunk] = []
        turn = self.waiting.next_bucket()
        prefilling = {self.waiting.bucket_of(r) for r in self.running if r.in_prefill}
        if turn is None or (prefilling and prefilling != {turn}):
            return out
        now = self.clock()
        for seq in self.waiting.candidates(now, bucket=turn):
            if budget <= 0 or len(self.running) >= self.cfg.max_num_seqs:
                break
            kv = self.pool.new_seq()
            cached = 0
            if self.cache is not None:
                m = self.cache.match(seq.prompt_ids)
                if m.length:
                    cached = self.cache.adopt(kv, m)
            if not self._can_admit(seq, len(kv.full_pages)):
                if self.cache is not None:
                    self.cache.finish(kv, [], len(seq.prompt_ids))
                else:
                    self.pool.free_seq(kv)
                if self.waiting.may_skip(seq, now):
                    continue
                break
            self.waiting.pop(seq)
            seq.kv = kv
            seq.num_computed = seq.cached_tokens = cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = self._fit(seq, min(len(seq.prompt_ids) - seq.num_computed, budget))
            if n:
                out.append(self._chunk(seq, n))
                budget -= n
        return out

    def _fit(self, seq: Sequence, n: int) -> int:
        """Shrink a prefill chunk to the pages free right now (an earlier chunk of this step
        may have used the transient SWA headroom); 0 means wait for the next step."""
        P = self.pool.page_size
        fa, sa = self.pool.full.allocator, self.pool.swa.allocator
        free = fa.num_free + (fa.num_evictable if self.cache is not None else 0)
        if self.pool.hybrid:
            free = min(free, sa.num_free + (sa.num_evictable if self.cache is not None else 0))
        limit = (len(seq.kv.full_pages) + free) * P - seq.num_computed
        return max(0, min(n, limit))

    def _chunk(self, seq: Sequence, n: int, draft: list[int] | None = None) -> ScheduledChunk:
        start = seq.num_computed
        if self.cache is not None:
            self.cache.make_room(*self.pool.pages_to_grow(seq.kv, start + n))
        self.pool.grow(seq.kv, start + n)
        if draft:
            return ScheduledChunk(seq, start, n, True, draft)
        return ScheduledChunk(seq, start, n, sample=start + n >= seq.num_tokens)

    # ---- after the model ran -------------------------------------------------------
    def commit(self, chunks: list[ScheduledChunk]) -> None:
        """Advance computed counts, release out-of-window SWA, retire finished requests."""
        P = self.pool.page_size
        for c in chunks:
            seq = c.seq
            seq.num_computed = c.start + (c.n if c.kept is None else c.kept)
            if c.kept is not None and c.kept < c.n:     # rejected drafts: roll their KV back
                self.pool.truncate(seq.kv, seq.num_computed)
            self.pool.release_window(seq.kv, seq.num_computed)
            # Share KV as it is made: after every prefill chunk and every decode page.
            if self.cache is not None and seq.finish_reason is None and (
                    c.n > 1 or seq.num_computed % P == 0):
                self.cache.sync(seq.kv, seq.all_ids[:seq.num_computed], len(seq.prompt_ids))
        for seq in [c.seq for c in chunks if c.seq.finish_reason is not None]:
            self.finish(seq)

    def finish(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            if self.cache is not None:
                self.cache.finish(seq.kv, seq.all_ids[:seq.num_computed], len(seq.prompt_ids))
            else:
                self.pool.free_seq(seq.kv)
            seq.kv = None
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
