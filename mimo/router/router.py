"""Router: the routing set, the decision for one request, and the background loops.

The routing set is the workers in Redis (`--worker` URLs are added at start; workers that
publish add themselves; /router/workers adds and removes) or, without Redis, the `--worker`
list; a worker is routed to while its /health answers 200 (checked every health_interval,
and dropped at once when a request to it fails). Decisions: `policy.choose` over the state
read from Redis; `policy.fallback` when Redis is away or absent.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import httpx

from ..kvcache.radix.namespace import check_scope_string
from ..kvcache.radix.retention import window_pages
from ..kvcache.tiers.keys import KeyChain
from . import policy
from .config import RouterConfig
from .metrics import RouterMetrics
from .pd import PDPairing
from .prompt import Prompt
from .state import RouterState, StateUnavailable

log = logging.getLogger("mimo.router")

PENDING_MS = 30_000     # how long an in-flight request's pages count before the worker's own
# How long a prompt's end marks a later request through it as its continuation (the score's
# `continuation_weight`): a conversation's next turn, an agent's next step.
CONTINUE_MS = 300_000
MAX_SERVED = 100_000    # Responses ids remembered here with the worker that made them
SERVED_MS = 86_400_000  # ... and in Redis, for this long
HASH_PAGE = 16      # tokens per page of the fallback's key (no heartbeat tells the real one)


class NoWorker(Exception):
    """No healthy worker is left to try."""


def session_of(body) -> str | None:
    """A body's `prompt_cache_key` when it is one the workers take (else the worker answers
    the body, routed without it)."""
    v = body.get("prompt_cache_key") if isinstance(body, dict) else None
    try:
        return check_scope_string(v, "prompt_cache_key")
    except ValueError:
        return None


@dataclass(frozen=True)
class Pending:
    """What the request will leave cached on its worker (`RouterState.mark_pending`): its
    prompt's full pages, and live SWA on the windows before its retention checkpoints that
    a later request can end at (the prompt's end, where it leaves the cached path)."""
    incarnation: str
    full: list[bytes]
    swa: list[bytes]
    end: bytes          # the prompt's last page key: a request through it continues this one


@dataclass(frozen=True)
class Decision:
    url: str
    predicted: int          # cached tokens the worker will report (every tier's hit)
    prompt_len: int
    how: str
    score: float = 0.0
    pending: Pending | None = None
    credited: float = 0.0   # the score's: tokens weighted by the tier they come from
    tiers: tuple[int, int, int] = (0, 0, 0)     # predicted tokens from L1, L2, L3
    prefill: str | None = None  # PD: the prefill worker handing `url` (decode) the KV


class Router:
    def __init__(self, cfg: RouterConfig, prompts=None):
        self.cfg = cfg
        self.prompts = prompts              # PromptBuilder, or None: load-only decisions
        self.metrics = RouterMetrics()
        self.state = (RouterState(cfg.redis, cfg.router_id, cfg.redis_timeout,
                                  cfg.health_interval) if cfg.redis else None)
        self.pd = PDPairing(cfg.prefill, cfg.decode)
        self.configured = list(dict.fromkeys(cfg.workers + cfg.prefill + cfg.decode))
        self.members: list[str] = list(self.configured)
        self.healthy: dict[str, bool] = {w: True for w in self.configured}
        self.inflight: dict[str, int] = {}
        self._rr = itertools.count()
        # This replica's own pending marks ({incarnation: (full, SWA, prompt ends) {key:
        # expiry}}): the ones in Redis may land after the next decision's read.
        self._pending: dict[str, tuple[dict[bytes, float], ...]] = {}
        self._tasks: list[asyncio.Task] = []
        self._writes: set[asyncio.Task] = set()     # state writes under way (kept referenced)
        self._write_order = asyncio.Lock()
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(cfg.request_timeout, connect=3.0),
                                      limits=httpx.Limits(max_connections=2048,
                                                          max_keepalive_connections=256))
        self._probe = httpx.AsyncClient(timeout=2.0)
        # Responses this replica relayed: id -> the worker that made it (LRU, bounded).
        self.served: OrderedDict[str, str] = OrderedDict()

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        if self.state is not None:
            try:
                for w in self.configured:
                    await self.state.add_worker(w)
            except StateUnavailable as e:
                log.warning("Redis unavailable at start (%s): routing locally", e)
        await self.refresh()
        self._tasks = [asyncio.create_task(self._loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.http.aclose()
        await self._probe.aclose()
        if self.state is not None:
            await self.state.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval)
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one failure
                log.warning("router refresh failed: %r", e)

    async def refresh(self) -> None:
        """Membership from Redis, /health of every member, and this replica's in-flight
        counts renewed there (rewritten whole after an outage: the catch-up)."""
        if self.state is not None:
            try:
                await self.state.sync(self.inflight)
                members = await self.state.members()
                self.members = sorted(members | set(self.pd.prefill + self.pd.decode)
                                      | (set(self.configured) if not members else set()))
            except StateUnavailable:
                pass
            self._count_redis_errors()
        now = time.monotonic()
        for inc in list(self._pending):
            for part in self._pending[inc]:
                for k in [k for k, t in part.items() if t <= now]:
                    del part[k]
            if not any(self._pending[inc]):
                del self._pending[inc]
        ok = await asyncio.gather(*(self._health(w) for w in self.members))
        self.healthy = dict(zip(self.members, ok))
        for w, up in self.healthy.items():
            self.metrics.up.labels(w).set(1 if up else 0)
        if self.pd.configured:
            await self.pd.poll(self._probe, self.healthy)

    async def _health(self, url: str) -> bool:
        try:
            return (await self._probe.get(url + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    def _count_redis_errors(self) -> None:
        if self.state is None:
            return
        for op, n in self.state.errors.items():
            self.metrics.redis_errors.labels(op).inc(n)
        self.state.errors.clear()

    def mark_down(self, url: str) -> None:
        self.healthy[url] = False
        self.metrics.up.labels(url).set(0)

    async def add_worker(self, url: str) -> None:
        if self.state is not None:
            await self.state.add_worker(url)
        if url not in self.members:
            self.members.append(url)
        self.healthy[url] = await self._health(url)

    async def remove_worker(self, url: str) -> None:
        if self.state is not None:
            await self.state.remove_worker(url)
        if url in self.members:
            self.members.remove(url)
        self.healthy.pop(url, None)

    async def route(self, prompt: Prompt | None, exclude: frozenset[str] = frozenset(),
                    session: str | None = None, prefer: str | None = None) -> Decision:
        """Decide and count the request in flight. This replica's own in-flight counts come
        from memory (exact), the others' from Redis; between the state read and the count
        nothing awaits, so requests arriving together see each other and spread instead of
        all reading the same state and piling onto one worker."""
        d = await self.pd.decide(self, prompt, exclude, session, prefer)
        if d.pending is not None:         # seen by this replica's next decision at once
            now = time.monotonic()
            until, end_until = now + PENDING_MS / 1000, now + CONTINUE_MS / 1000
            full, swa, ends = self._pending.setdefault(d.pending.incarnation, ({}, {}, {}))
            full.update(dict.fromkeys(d.pending.full, until))
            swa.update(dict.fromkeys(d.pending.swa, until))
            ends[d.pending.end] = end_until
        # The shared copies are written behind the request's back: this replica's next
        # decisions read its own from memory, so nothing waits for them.
        for w in (d.url, d.prefill) if d.prefill else (d.url,):
            self.inflight[w] = self.inflight.get(w, 0) + 1
            self.metrics.inflight.labels(w).set(self.inflight[w])
            self._background(self._inflight_add(w, 1))
        if d.pending is not None and self.state is not None:
            self._background(self._mark(d.pending))
        return d

    def _background(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._writes.add(t)
        t.add_done_callback(self._writes.discard)

    async def _mark(self, p: Pending) -> None:
        assert self.state is not None
        try:
            await self.state.mark_pending(p.incarnation, p.full, p.swa, p.end, PENDING_MS,
                                          CONTINUE_MS)
        except StateUnavailable:
            self._count_redis_errors()

    # ---- in-flight ----------------------------------------------------------------------
    async def end(self, d: Decision) -> None:
        for w in (d.url, d.prefill) if d.prefill else (d.url,):
            self.inflight[w] = self.inflight.get(w, 0) - 1
            self.metrics.inflight.labels(w).set(self.inflight[w])
        if d.prefill:
            await self._inflight_add(d.prefill, -1)
        # Awaited (after its begin, in order): once a client has its answer, every replica
        # sees the worker's load without it.
        await self._inflight_add(d.url, -1)

    async def _inflight_add(self, url: str, n: int) -> None:
        # In order (asyncio.Lock is FIFO and these tasks start in creation order), so an
        # end never overtakes its begin in Redis.
        async with self._write_order:
            if self.state is not None and not self.state.need_sync:
                try:
                    await self.state.inflight_add(url, n)
                except StateUnavailable:
                    self._count_redis_errors()

    # ---- Responses ------------------------------------------------------------------------
    def note_served(self, response_id: str, url: str) -> None:
        """Remember a response's maker here and, behind the answer, in Redis for the other
        replicas."""
        self.served[response_id] = url
        self.served.move_to_end(response_id)
        while len(self.served) > MAX_SERVED:
            self.served.popitem(last=False)
        if self.state is not None:
            self._background(self._note_shared(response_id, url))

    async def _note_shared(self, response_id: str, url: str) -> None:
        assert self.state is not None
        try:
            await self.state.note_served(response_id, url, SERVED_MS)
        except StateUnavailable:
            self._count_redis_errors()

    async def served_by(self, response_id) -> str | None:
        """The worker that made a response a replica relayed (None: not known)."""
        if not isinstance(response_id, str) or not response_id:
            return None
        url = self.served.get(response_id)
        if url is None and self.state is not None:
            try:
                url = await self.state.served_by(response_id)
            except StateUnavailable:
                self._count_redis_errors()
        return url

    # ---- decisions ----------------------------------------------------------------------
    async def tokenize(self, kind: str, body) -> Prompt | None:
        """The prompt as the workers would build and key it (None: not known)."""
        if self.prompts is None or self.cfg.policy != "cache-aware":
            return None
        # On the loop: a few milliseconds for long prompts, less than a thread hop costs
        # on a loaded machine.
        return self.prompts.prompt(kind, body)

    async def decide(self, kind: str, body, exclude: frozenset[str] = frozenset()) -> Decision:
        """The decision for a body of `kind` ("chat", "completion" or "responses")."""
        prefer = (await self.served_by(body.get("previous_response_id"))
                  if kind == "responses" and isinstance(body, dict) else None)
        return await self.pd.decide(self, await self.tokenize(kind, body), exclude,
                                    session_of(body), prefer)

    async def decide_prompt(self, prompt: Prompt | None, exclude: frozenset[str] = frozenset(),
                            session: str | None = None, prefer: str | None = None
                            ) -> Decision:
        """`session`: the request's prompt_cache_key (its affinity key), if any. `prefer`:
        the worker to take while it is healthy (the one that served the previous response
        of a Responses chain: its KV holds the chain)."""
        ids = prompt.ids if prompt is not None else None
        ns = prompt.namespace if prompt is not None else None
        live = [w for w in self.members if self.healthy.get(w) and w not in exclude]
        if not live:
            raise NoWorker("no healthy worker")
        n = len(ids) if ids else 0
        akey = policy.affinity_key(session) if session is not None else None
        if prefer is not None and prefer in live:
            self.metrics.decisions.labels("previous").inc()
            return Decision(prefer, 0, n, "previous")
        if self.cfg.policy == "round-robin" and akey is None:
            self.metrics.decisions.labels("round-robin").inc()
            return Decision(live[next(self._rr) % len(live)], 0, n, "round-robin")
        head = ids[:self.cfg.fallback_pages * HASH_PAGE] if ids else []
        # The namespace too: prompts with different images share their text's ids.
        tie = hashlib.blake2b(array("q", head).tobytes()
                              + (repr(ns).encode() if ns is not None else b""),
                              digest_size=16).digest()
        if self.state is not None and self.cfg.policy != "round-robin":
            try:
                keys_for = self._keys_for(ids or [], ns)
                return self._score(ids or [], live, tie,
                                   *await self.state.read(live, keys_for), keys_for, akey)
            except StateUnavailable:
                self._count_redis_errors()
        how = "fallback" if akey is None else "affinity"
        self.metrics.decisions.labels(how).inc()
        return Decision(policy.fallback(akey or tie, live, self.inflight), 0, n, how)

    @staticmethod
    def _keys_for(ids: list[int], namespace=None):
        cache: dict = {}

        def keys(fp: bytes, page: int) -> list[bytes]:
            if (fp, page) not in cache:
                n = policy.prompt_pages(len(ids), page)
                cache[(fp, page)] = (KeyChain(fp, page).page_keys(ids[:n * page], namespace)
                                     if n else [])
            return cache[(fp, page)]
        return keys

    def _predict(self, hb, held, full, swa) -> policy.Prediction:
        return policy.tiered(full, swa if hb.mode == "hybrid" else None, hb.window,
                             hb.page_size, hb.rebuild, held.l2, held.l3, self.cfg.l2_credit,
                             self.cfg.l3_credit)

    def _score(self, ids, live, tie, snap, pages, keys_for, akey: bytes | None = None
               ) -> Decision:
        cands, expect = [], {}
        for w in live:
            hb = snap.heartbeats.get(w)
            credit, cont = 0.0, False
            if hb is not None and w in pages:
                h = pages[w]
                full_p, swa_p, cont = h.full_p, h.swa_p, h.cont
                mine = self._pending.get(hb.incarnation)
                if mine is not None:
                    keys, now = keys_for(hb.fingerprint, hb.page_size), time.monotonic()
                    full_p = [a or mine[0].get(k, 0) > now for a, k in zip(full_p, keys)]
                    swa_p = [a or mine[1].get(k, 0) > now for a, k in zip(swa_p, keys)]
                    cont = cont or any(mine[2].get(k, 0) > now for k in keys)
                expect[w] = self._predict(hb, h, full_p, swa_p)
                # it continues a request routed there (in flight or done): follow it
                credit = expect[w].credit if cont else self._predict(hb, h, h.full, h.swa).credit
            queued = hb.uncached_tokens / self.cfg.load_token_unit if hb is not None else 0.0
            flight = snap.inflight.get(w, 0) + self.inflight.get(w, 0)
            cands.append(policy.Candidate(w, credit, flight + queued, cont))
        # The score credits what workers hold, and what requests in flight will leave only
        # for a request that continues one (a next turn, sent before or after the last one
        # ended): a prefix they merely share (a system prompt's first wave) must not pull
        # every new session after it, or they pile up there. The prediction counts it all.
        c = policy.affine(akey, cands) if akey is not None else None
        if c is None:
            c = policy.choose(cands, len(ids), self.cfg.match_weight, tie,
                              self.cfg.continuation_weight)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route %d tokens -> %s %s", len(ids), c.url,
                      [(x.url[-5:], x.predicted, round(x.load, 2)) for x in cands])
        self.metrics.decisions.labels(c.how).inc()
        hb = snap.heartbeats.get(c.url)
        pending = None
        if hb is not None and hb.mode != "off" and ids:
            keys = keys_for(hb.fingerprint, hb.page_size)
            if keys:
                full_ok = pages[c.url].full if c.url in pages else []
                m = next((i for i, ok in enumerate(full_ok) if not ok), len(full_ok))
                swa: set[int] = set()
                if hb.mode == "hybrid":
                    for end in {len(keys), m}:
                        swa.update(window_pages(end * hb.page_size, hb.window, hb.page_size))
                pending = Pending(hb.incarnation, keys, [keys[i] for i in sorted(swa)
                                                         if i < len(keys)], keys[-1])
        e = expect.get(c.url)
        if e is None:
            return Decision(c.url, 0, len(ids), c.how, c.score, pending)
        return Decision(c.url, e.tokens, len(ids), c.how, c.score, pending, c.predicted,
                        (e.tokens - (e.l2_pages + e.l3_pages) * hb.page_size,
                         e.l2_pages * hb.page_size, e.l3_pages * hb.page_size))
