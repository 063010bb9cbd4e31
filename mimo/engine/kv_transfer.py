"""KVTransfers: the decode side of disaggregated serving (mimo/disagg) in the engine; the
prefill side hands its KV over frame by frame (kv_export.py).

Import (a decode worker): a request whose prompt KV was computed elsewhere waits here, the
payload in host memory, until the scheduler could admit it under its own rule (both pools,
reservations of the running requests, the step's transient SWA headroom). Admitted, it gets
full pages for the prompt and SWA pages for the window only, the payload is copied in, and
it joins the running batch with every token but its last computed: a request whose first
token came with the payload decodes next; one without computes its last prompt token and
samples its first token itself. An import that cannot be placed (a payload that does not
fit this pool, a failed copy) becomes a local recompute: the request is queued as a fresh
one, never failed. Engine thread only.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ..kvcache.kv_payload import KVPayload, import_payload
from .sequence import NO_CACHE, Sequence, Status

if TYPE_CHECKING:
    from ..kvcache.pool.dual_pool import DualPool
    from ..kvcache.radix.prefix_cache import PrefixCache
    from .scheduler import Scheduler

log = logging.getLogger("mimo.engine")


class KVTransfers:
    def __init__(self, scheduler: Scheduler, pool: DualPool, cache: PrefixCache | None):
        self.sched, self.pool, self.cache = scheduler, pool, cache
        self._pending: deque[Sequence] = deque()
        self.imported = 0           # requests admitted with transferred KV (since start)
        self.recomputed = 0         # imports that became local recomputes

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, seq: Sequence, payload: KVPayload) -> None:
        """Queue `seq` (prompt, and its first token when the payload's worker sampled it)
        to run on `payload`; a payload that does not fit this engine is a recompute."""
        try:
            if payload.tokens != len(seq.prompt_ids) or seq.num_tokens - 1 > payload.tokens:
                raise ValueError(f"payload of {payload.tokens} tokens for a prompt of "
                                 f"{len(seq.prompt_ids)}")
            payload.check_fits(self.pool)
        except ValueError as e:
            log.warning("transferred KV refused (%s): recomputing locally", e)
            self._recompute(seq)
            return
        seq.kv_import = payload
        seq.queued_at = self.sched.clock()
        self._pending.append(seq)

    def abort(self, seq: Sequence) -> bool:
        if seq in self._pending:
            self._pending.remove(seq)
            seq.kv_import = None
            return True
        return False

    def admit(self) -> None:
        """Admit waiting imports in arrival order while they fit (head of line waits)."""
        sched = self.sched
        while self._pending and len(sched.running) < sched.cfg.max_num_seqs:
            seq = self._pending[0]
            payload = seq.kv_import
            assert payload is not None
            if not self._fits(seq, payload):
                if sched.running:
                    return          # room comes as running requests finish
                if not self._placeable(payload):    # alone and still no room: never
                    self._pending.popleft()
                    log.warning("transferred KV does not fit this pool: recomputing locally")
                    self._recompute(seq)
                    continue
            self._pending.popleft()
            seq.kv_import = None
            kv = self.pool.new_seq()
            try:
                if self.cache is not None:
                    held = payload.num_pages - payload.swa_first_page if self.pool.hybrid else 0
                    self.cache.make_room(payload.num_pages, held)
                self.pool.grow_imported(kv, payload.tokens, payload.swa_first_page)
                import_payload(self.pool, kv, payload)
            except Exception as e:  # noqa: BLE001 - a failed import is a recompute
                log.warning("placing transferred KV failed (%r): recomputing locally", e)
                self.pool.free_seq(kv)
                self._recompute(seq)
                continue
            ns = seq.cache_namespace
            kv.namespace = None if ns is NO_CACHE else ns
            kv.protect = seq.scope.session is not None
            seq.kv, seq.num_computed = kv, seq.num_tokens - 1
            seq.admitted_at = sched.clock()
            seq.status = Status.RUNNING
            sched.running.append(seq)
            self.imported += 1

    def _fits(self, seq: Sequence, payload: KVPayload) -> bool:
        """The scheduler's admission rule (`Scheduler._can_admit`) for a request arriving
        with its pages: the window it brings may exceed the steady SWA reservation."""
        sched, pool = self.sched, self.pool
        f, s = sched.need(seq)
        f = max(f, payload.num_pages)
        held_s = payload.num_pages - payload.swa_first_page if pool.hybrid else 0
        s = max(s, held_s)
        needs = [(sched.need(r), len(r.running_kv.full_pages)) for r in sched.running]
        outstanding = sum(max(0, fr - held) for (fr, _), held in needs)
        steady = sum(sr for (_, sr), _ in needs)
        free_f, free_s = sched._available()
        return (free_f - outstanding >= f and held_s <= free_s
                and steady + s + sched._transient <= pool.swa.allocator.capacity)

    def _placeable(self, payload: KVPayload) -> bool:
        """Whether the payload's pages fit the pools at all now (free or evictable)."""
        free_f, free_s = self.sched._available()
        held_s = payload.num_pages - payload.swa_first_page if self.pool.hybrid else 0
        return payload.num_pages <= free_f and held_s <= free_s

    def _recompute(self, seq: Sequence) -> None:
        """Queue as a fresh request: prefill the prompt and any first token given, then go
        on sampling after them (as a preempted request resumes)."""
        seq.kv_import = None
        seq.prefill_end = seq.num_tokens
        self.recomputed += 1
        self.sched.add(seq)
