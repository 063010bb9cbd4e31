"""Continuous batching with chunked prefill. Bookkeeping only: never imports the model or
torch (tests/engine/test_scheduler.py drives it on bookkeeping-only pools).

Each step: every running request in decode gets its one token, then prefill chunks (running
requests first, then newly admitted ones in queue order) take the token budget, less any
speculative drafts: `max_num_batched_tokens` when nobody decodes, the smaller mixed budget
(`SchedulerConfig.step_tokens`) while anyone does, whose next token waits for the step. Large
steps run the GEMMs better (oneDNN at 512 rows costs ~1.3x a token what it does at 1,536; see
docs/speed.md); small ones keep decoding streams moving. The decodes' own tokens ride on top:
a step costs about the same with a few more rows, and charging them to the budget ended
prompts a few tokens past a step's edge, their first token one whole step later (16 prompts
of 256 tokens arriving at once: the 8th finished in the 5th step, not the 4th).

Admission (`SchedulerConfig.admission`) 'reserve' reserves each request's worst case, below;
'optimistic' reserves only the full pages of its prefill plus one, and before each step
preempts the newest running request while decoding requests could not grow (`preempt`:
its KV goes to the prefix cache, it rejoins the queue with its arrival time and resumes by
prefilling prompt + output so far, mostly cache hits); either pool running short for the
decodes preempts. SWA is always reserved as below. With 'reserve': Full pool: pages for
prompt + max_tokens. SWA pool: every running request's steady window (window + one page),
plus the transient pages of one mixed-budget chunk, shared by all (a prefill chunk briefly
holds window + chunk; the excess is released at the end of its step). So decode tokens can
always grow, at least one prefill chunk fits every step, nothing deadlocks and no request dies
mid-generation; a request that does not fit waits until running ones finish. A larger chunk
(a step with nobody decoding) is bounded by the pages free when it is planned (`room`), so it
takes nobody's reservation past its own step.

The lock rule (what the prefix cache's lock pins against what is reserved), kept here in
`need` and in `RadixPrefixCache.sync` / `window_released`: a running request's lock pins
only pages in its own tables, which its reservation counts. Full: sync adopts the tree's
copy of tokens the request recomputed before moving the lock onto it. SWA: the lock pins
the window before its node, and `window_released` (after every window release) unpins the
pages of it the table no longer holds, so decoding past the cached window holds no more
than the steady window reserved at admission. `need` adds whatever a cache still pins
outside the tables (`pinned_outside`; the radix cache: nothing, between steps). So a page is
reserved once, and a pinned page admission had counted as evictable is always reserved.
Under 'reserve' an `OutOfPages` is therefore a bug (logged as one by the engine).

Prefixes in flight: a waiting request is passed over (not blocking those behind it) while a
running request still prefilling will compute at least one more page of the prefix the two
share beyond what the waiting one has cached (`_shares_work`); it is admitted once that part
is in the prefix cache. Shared tokens are computed once, and what a request reuses is what
its worker holds or is computing (what the router's prediction credits: mimo/router).

A step that raises fails only the requests it touched (`touched`, `fail`; none of their KV cached).

Speculative decoding (`num_draft` > 0): a decoding request's chunk is its last token plus up
to `num_draft` draft tokens, all verified in the step, cut so that every token a step can
emit fits in max_tokens (the full reservation is unchanged); the steady SWA reservation grows
to window + num_draft (a verify chunk holds the window behind its last token plus the
drafts). `commit` keeps the accepted positions' KV and frees the pages past them; SWA release
follows the accepted length, so a rollback never needs released SWA KV. A drafter with its
own SWA-kind layers (MTP) reads their KV up to `swa_lag` positions behind the computed
length: release trails by that much and the steady SWA reservation grows by it.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..config import SchedulerConfig
from ..kvcache.pool.layout import swa_steady_pages, swa_transient_pages
from .policy import WaitingPolicy, make_policy
from .prefill_planner import ChunkedPrefill, PrefillPlanner
from .scheduled_chunk import ScheduledChunk
from .sequence import NO_CACHE, Sequence, Status

if TYPE_CHECKING:
    from ..kvcache.pool.dual_pool import DualPool
    from ..kvcache.radix.prefix_cache import PrefixCache

__all__ = ["Scheduler", "ScheduledChunk"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _common_prefix(a: list[int], b: list[int], n: int) -> int:
    """The length of a[:n]'s and b[:n]'s common prefix: doubling then bisecting on slice
    equality, so the comparisons run in C and each token is compared O(1) times on average
    (and neither list is copied whole)."""
    lo, n = 0, min(n, len(a), len(b))
    step = 64
    while lo < n:               # a[:lo] == b[:lo] holds
        hi = min(n, lo + step)
        if a[lo:hi] == b[lo:hi]:
            lo, step = hi, step * 2
        elif step == 1:
            return lo
        else:
            step //= 2
    return lo


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: DualPool, cache: PrefixCache | None = None,
                 num_draft: int = 0, swa_lag: int = 0, prefill: PrefillPlanner | None = None):
        self.cfg = cfg
        self.num_draft = num_draft
        self.swa_lag = swa_lag
        self.pool = pool
        self.cache = cache          # None: no prefix caching
        self.prefill = prefill or ChunkedPrefill()
        opts = {}
        if cfg.policy == "compute-aware":
            # Uncached tokens as the prefix cache stands when the request arrives.
            opts = {"aging_per_second": cfg.aging_per_second, "uncached": self._uncached}
        self.waiting: WaitingPolicy = make_policy(cfg.policy, buckets=cfg.length_buckets, **opts)
        self.running: list[Sequence] = []
        self.num_preemptions = 0    # since start (/metrics)
        # The requests a step that raises fails (LLMEngine.step): set by `schedule`.
        self.touched: list[Sequence] = []
        self._current: Sequence | None = None   # the request being planned
        self.clock = time.monotonic

    def _cache_of(self, seq: Sequence) -> PrefixCache | None:
        """The prefix cache this request goes through, None if it goes through none."""
        return self.cache if seq.cache_namespace is not NO_CACHE else None

    def _uncached(self, seq: Sequence) -> int:
        tokens = seq.all_ids[:seq.prefill_end]
        cache = self._cache_of(seq)
        cached = cache.cached_len(tokens, seq.cache_namespace) if cache is not None else 0
        return len(tokens) - cached

    # ---- capacity -------------------------------------------------------------------
    def need(self, seq: Sequence, kv=None, worst: bool = False) -> tuple[int, int]:
        """(full pages, steady SWA pages) the request may hold between steps. Full: every
        token it may ever hold when admission reserves (or `worst`), else its prefill and
        one decode page (optimistic: growth beyond is met by preemption). SWA: always exact,
        its window plus the pages it holds for the prefix cache's retention checkpoints."""
        P = self.pool.page_size
        kv = kv if kv is not None else seq.kv
        if worst or self.cfg.admission == "reserve":
            full = _cdiv(seq.max_len, P)
        else:
            full = _cdiv(min(seq.prefill_end + 1, seq.max_len), P)
        # A verify chunk holds the window behind its last token plus the drafts.
        swa = (swa_steady_pages(self.pool.window + self.num_draft + self.swa_lag, P, seq.max_len)
               if self.pool.hybrid else 0)
        if kv is not None and self.pool.hybrid:
            swa += len(kv.keep_swa)
        cache = self._cache_of(seq)
        if kv is not None and cache is not None:
            pf, ps = cache.pinned_outside(kv)
            full, swa = full + pf, swa + ps
        return full, swa

    @property
    def _transient(self) -> int:
        if not self.pool.hybrid:
            return 0
        return swa_transient_pages(self.cfg.mixed_step_tokens, self.pool.page_size)

    def fits_empty_pool(self, seq: Sequence) -> bool:
        f, s = self.need(seq, worst=True)
        return (f <= self.pool.full.allocator.capacity
                and s + self._transient <= self.pool.swa.allocator.capacity)

    def _can_admit(self, seq: Sequence, kv) -> bool:
        """`kv`: the request's pages so far (a locked prefix-cache match, if any)."""
        f, s = self.need(seq, kv)
        held = len(kv.full_pages)
        needs = [(self.need(r), len(r.running_kv.full_pages)) for r in self.running]
        outstanding_full = sum(max(0, f_r - held_r) for (f_r, _), held_r in needs)
        steady_swa = sum(s_r for (_, s_r), _ in needs)
        return (self._available()[0] - outstanding_full >= f - held
                and steady_swa + s + self._transient <= self.pool.swa.allocator.capacity)

    # ---- queue ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.queued_at = self.clock()
        self.waiting.push(seq, seq.queued_at)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: dict | None = None) -> list[ScheduledChunk]:
        """`drafts`: {sequence in decode: draft tokens} (speculative decoding), or None.
        Sets `touched`: the requests of the chunks returned or, if planning raises, the
        one request being planned then (the chunks planned before it only grew page
        tables, which the next step reuses as they are)."""
        self.touched, self._current = [], None
        try:
            out = self._schedule(drafts)
        except Exception:
            self.touched = [self._current] if self._current is not None else list(self.running)
            raise
        self.touched = [c.seq for c in out]
        return out

    def _schedule(self, drafts: dict | None) -> list[ScheduledChunk]:
        out: list[ScheduledChunk] = []
        if self.cfg.admission == "optimistic":
            self._preempt_for_decode()
        budget = self.cfg.step_tokens(any(not s.in_prefill for s in self.running))
        # Every decode gets its own token, on top of the budget; drafts share the budget
        # with this step's prefill chunks.
        spare = budget
        # Pages the decodes not yet scheduled need for their own token: drafts never take
        # them (with optimistic admission the pool may hold exactly that much).
        own = {id(s): self.pool.pages_to_grow(s.running_kv, s.num_computed + 1)
               for s in self.running if not s.in_prefill} if drafts else {}
        later = [sum(f for f, _ in own.values()), sum(w for _, w in own.values())]
        for seq in self.running:
            if not seq.in_prefill:
                d = drafts.get(seq, []) if drafts else []
                # A step emits at most len(d) + 1 tokens: never more than max_tokens allows.
                d = d[:max(0, min(self.num_draft, spare, seq.max_len - seq.num_tokens - 1))]
                if own:
                    f, w = own[id(seq)]
                    later[0] -= f
                    later[1] -= w
                while d and not self._room(seq, 1 + len(d), later):
                    d = d[:-1]
                spare -= len(d)
                out.append(self._chunk(seq, 1 + len(d), d))
                budget -= len(d)
        for seq in self.running:
            if seq.in_prefill and budget > 0:
                self._current = seq
                n = self._prefill_tokens(seq, budget)
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
            self._current = seq
            kv = self.pool.new_seq()
            kv.protect = seq.scope.session is not None
            cached = 0
            cache = self._cache_of(seq)
            if cache is not None:
                try:
                    cached = cache.admit(kv, seq.all_ids[:seq.prefill_end],
                                         len(seq.prompt_ids), seq.max_len,
                                         seq.cache_namespace)
                except Exception:
                    cache.release(kv)
                    raise
            if cache is not None and self._shares_work(seq, cached):
                cache.release(kv)
                continue
            if not self._can_admit(seq, kv) and kv.keep_swa:
                kv.keep_swa = frozenset()   # too tight to hold retention windows: run anyway
            if not self._can_admit(seq, kv):
                if cache is not None:
                    cache.release(kv)
                else:
                    self.pool.free_seq(kv)
                if self.waiting.may_skip(seq, now):
                    continue
                break
            self.waiting.pop(seq)
            seq.admitted_at = now
            seq.kv = kv
            seq.num_computed = cached
            if not seq.preemptions:
                seq.cached_tokens = cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = self._prefill_tokens(seq, budget)
            if n:
                out.append(self._chunk(seq, n))
                budget -= n
        return out

    def _shares_work(self, seq: Sequence, cached: int) -> bool:
        """Whether a running request still prefilling will compute at least one page of
        `seq`'s prefill beyond its `cached` tokens (the in-flight rule above)."""
        P = self.pool.page_size
        ids = seq.all_ids
        for r in self.running:
            if not r.in_prefill or r.cache_namespace != seq.cache_namespace:
                continue
            end = min(seq.prefill_end, r.prefill_end)
            shared = _common_prefix(ids, r.all_ids, end) // P * P
            if shared - max(cached, r.num_computed) >= P:
                return True
        return False

    def _prefill_tokens(self, seq: Sequence, budget: int) -> int:
        """This step's prefill chunk for `seq`, from the prefill step, within the pages free
        right now (an earlier chunk of this step may have used the transient SWA headroom);
        0 means wait for the next step."""
        P = self.pool.page_size
        free_f, free_s = self._available()
        kv = seq.running_kv
        room = (len(kv.full_pages) + free_f) * P - seq.num_computed
        if self.pool.hybrid:    # (a window rebuild holds full pages ahead of its SWA pages)
            room = min(room, (len(kv.swa_pages) + free_s) * P - seq.num_computed)
        remaining = seq.prefill_end - seq.num_computed
        n = self.prefill.plan(seq, remaining, budget, max(0, room))
        if not 0 <= n <= min(remaining, budget, max(0, room)):
            raise ValueError(f"prefill step planned {n} tokens; allowed 0..{min(remaining, budget, room)}")
        return n

    def _room(self, seq: Sequence, n: int, reserve=(0, 0)) -> bool:
        """Whether growing `seq` by n tokens fits the free (and cache-evictable) pages, less
        `reserve` (full, swa) pages kept for others."""
        f, w = self.pool.pages_to_grow(seq.running_kv, seq.num_computed + n)
        free_f, free_s = self._available()
        return f + reserve[0] <= free_f and w + reserve[1] <= free_s

    def _available(self) -> tuple[int, int]:
        """(full, SWA) pages a request can get now: free, plus what eviction from the
        prefix cache would free."""
        fa, sa = self.pool.full.allocator, self.pool.swa.allocator
        if self.cache is None:
            return fa.num_free, sa.num_free
        return fa.num_free + fa.num_evictable, sa.num_free + sa.num_evictable

    def _chunk(self, seq: Sequence, n: int, draft: list[int] | None = None) -> ScheduledChunk:
        self._current = seq
        start, kv = seq.num_computed, seq.running_kv
        if self.cache is not None:
            self.cache.make_room(*self.pool.pages_to_grow(kv, start + n))
        self.pool.grow(kv, start + n)
        if draft:
            return ScheduledChunk(seq, start, n, True, draft)
        return ScheduledChunk(seq, start, n, sample=start + n >= seq.num_tokens)

    # ---- preemption (optimistic admission) -----------------------------------------------
    def _preempt_for_decode(self) -> None:
        """Make room for this step's decode tokens: while either pool (free + cache
        evictable) cannot grow every decoding request by one token, preempt the request
        admitted last. Its KV goes to the prefix cache (when there is one), so resuming
        recomputes little; it rejoins the queue with its original arrival time."""
        while len(self.running) > 1:
            grow = [self.pool.pages_to_grow(r.running_kv, r.num_computed + 1)
                    for r in self.running if not r.in_prefill]
            free_f, free_s = self._available()
            if sum(f for f, _ in grow) <= free_f and sum(s for _, s in grow) <= free_s:
                return
            self.preempt(self.running[-1])

    def preempt(self, seq: Sequence) -> None:
        self._current = seq
        self.running.remove(seq)
        tokens = seq.all_ids[:seq.num_computed]
        cache = self._cache_of(seq)
        if cache is not None:
            cache.finish(seq.running_kv, tokens, len(seq.prompt_ids))
        else:
            self.pool.free_seq(seq.running_kv)
        seq.kv, seq.num_computed = None, 0
        seq.prefill_end = seq.num_tokens
        seq.preemptions += 1
        self.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.push(seq, self.clock(), since=seq.queued_at)

    # ---- after the model ran -------------------------------------------------------
    def commit(self, chunks: list[ScheduledChunk],
               kept: dict[ScheduledChunk, int] | None = None) -> None:
        """Advance computed counts, release out-of-window SWA, retire finished requests.
        `kept`: for chunks whose later positions were rejected (drafts), how many leading
        positions keep their KV; the rest is rolled back. Other chunks keep all `n`."""
        kept = kept or {}
        for c in chunks:
            seq, kv = c.seq, c.seq.running_kv
            k = kept.get(c, c.n)
            seq.num_computed = c.start + k
            if k < c.n:                     # rejected drafts: roll their KV back
                self.pool.truncate(kv, seq.num_computed)
            # SWA is kept from `kept_from` on (a lagging drafter reads it). Prompt KV is shared
            # up to there as it is made (a concurrent request with the same prefix reuses it),
            # before window release, which may free pages the tree would keep.
            kept_from = max(0, seq.num_computed - self.swa_lag)
            cache = self._cache_of(seq)
            if cache is not None and seq.finish_reason is None and c.start < seq.prefill_end:
                cache.sync(kv, seq.all_ids[:kept_from], len(seq.prompt_ids))
            if cache is not None and seq.finish_reason is not None:
                continue        # finish offers the cache every page still live (retention)
            self.pool.release_window(kv, kept_from)
            if cache is not None:
                cache.window_released(kv)
        for seq in [c.seq for c in chunks if c.seq.finish_reason is not None]:
            self.finish(seq)

    def fail(self, seq: Sequence) -> None:
        """End a request whose step failed: its pages are freed and none of its KV is
        offered to the cache (it may be half written)."""
        self.finish(seq, offer=False)

    def finish(self, seq: Sequence, offer: bool = True) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            cache = self._cache_of(seq)
            if cache is not None:
                tokens = seq.all_ids[:seq.num_computed] if offer else []
                cache.finish(seq.running_kv, tokens, len(seq.prompt_ids))
            else:
                self.pool.free_seq(seq.running_kv)
            seq.kv = None
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
