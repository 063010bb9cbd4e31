"""PD pairing: a request goes to a decode worker, told (header x-mimo-prefill) which prefill
worker computes its prompt and hands over the KV (mimo/disagg on the workers).

The prefill worker is chosen as any request's worker is, by the cache-aware score over the
prefill workers only (what their caches hold and their load: the prompt is computed there).
The decode worker by load and free KV: this replica's requests in flight on it plus what it
reports (`/v1/internal/kv_transfers`: requests waiting and running, the free fraction of its
tightest KV pool, polled with the health checks), lowest first; ties rotate. While no prefill
or no decode worker is healthy, requests go to any healthy worker whole (every role serves
the whole API), so the client gets its answer, or the usual 503 when none is left.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass

import httpx

STATS_PATH = "/v1/internal/kv_transfers"


@dataclass
class DecodeLoad:
    waiting: int = 0
    running: int = 0
    kv_free: float = 1.0        # free (or evictable) fraction of its tightest pool


class PDPairing:
    def __init__(self, prefill: tuple[str, ...], decode: tuple[str, ...]):
        self.prefill, self.decode = list(prefill), list(decode)
        self.loads: dict[str, DecodeLoad] = {}
        self._rr = itertools.count()

    @property
    def configured(self) -> bool:
        return bool(self.prefill and self.decode)

    def live(self, healthy: dict[str, bool], exclude: frozenset[str]
             ) -> tuple[list[str], list[str]]:
        ok = [w for w in self.prefill if healthy.get(w)]
        return ok, [w for w in self.decode if healthy.get(w) and w not in exclude]

    def not_prefill(self, members: list[str]) -> frozenset[str]:
        """Members a prefill decision must skip."""
        return frozenset(w for w in members if w not in self.prefill)

    def pick_decode(self, live: list[str], inflight: dict[str, int]) -> str:
        """Least loaded: requests in flight (this replica's) and reported running + waiting,
        plus how full its KV is (a full pool weighs as one request more)."""
        def score(w: str) -> float:
            ld = self.loads.get(w, DecodeLoad())
            return inflight.get(w, 0) + 0.5 * (ld.waiting + ld.running) + (1.0 - ld.kv_free)
        best = min(score(w) for w in live)
        tied = [w for w in live if score(w) - best < 1e-9]
        return tied[next(self._rr) % len(tied)]

    async def decide(self, router, prompt, exclude: frozenset[str], session: str | None,
                     prefer: str | None):
        """`router`'s decision (a router.Decision): paired while a prefill and a decode
        worker are healthy, else its plain decision among every healthy worker."""
        if self.configured:
            pre, dec = self.live(router.healthy, exclude)
            if pre and dec:
                p = await router.decide_prompt(prompt, self.not_prefill(router.members),
                                               session)
                url = self.pick_decode(dec, router.inflight)
                router.metrics.decisions.labels("pd").inc()
                return dataclasses.replace(p, url=url, prefill=p.url, how=f"pd/{p.how}")
        return await router.decide_prompt(prompt, exclude, session, prefer)

    async def poll(self, http: httpx.AsyncClient, healthy: dict[str, bool]) -> None:
        """Refresh the decode workers' reported load (a failed poll keeps the last one)."""
        async def one(w: str) -> None:
            try:
                r = await http.get(w + STATS_PATH)
                ld = r.json().get("load") if r.status_code == 200 else None
                if isinstance(ld, dict):
                    self.loads[w] = DecodeLoad(int(ld.get("waiting", 0)),
                                               int(ld.get("running", 0)),
                                               float(ld.get("kv_free", 1.0)))
            except (httpx.HTTPError, ValueError, TypeError):
                pass
        await asyncio.gather(*(one(w) for w in self.decode if healthy.get(w)))
