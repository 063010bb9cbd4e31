"""Continuations in the router's decisions, with a real Redis and workers' published state
written as a worker writes it: a request whose prompt runs through the end of one routed
earlier (by this replica or another) follows it onto a busier worker; a request that only
shares a prefix with it, or any request at `--continuation-weight 1`, goes to an idle one;
a worker that restarted (a new incarnation) carries no continuation marks."""
from __future__ import annotations

import asyncio
import json
import time

import redis

from mimo.kvcache.tiers.keys import FULL, KeyChain
from mimo.router import cache_events as ce
from mimo.router.config import RouterConfig
from mimo.router.policy import prompt_pages
from mimo.router.prompt import Prompt
from mimo.router.router import Router

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
FP, P = bytes(8), 16
HISTORY = list(range(1, 20 * P + 2))            # 20 whole pages and one token
NEXT_TURN = HISTORY + list(range(500, 540))     # runs through HISTORY's end
SHARED_ONLY = HISTORY[:10 * P] + list(range(700, 900))


def _keys(ids):
    return KeyChain(FP, P).page_keys(ids[:prompt_pages(len(ids), P) * P])


def _publish(r: redis.Redis, url: str, inc: str, ids=None) -> None:
    hb = {"incarnation": inc, "fingerprint": FP.hex(), "page_size": P, "window": 0,
          "mode": "full", "uncached_tokens": 0}
    r.set(ce.heartbeat_key(url), json.dumps(hb), px=60_000)
    if ids:
        r.sadd(ce.pages_key(inc, FULL), *_keys(ids))


def _busy(r: redis.Redis, url: str, n: int) -> None:
    """n requests in flight on url, counted by a replica that is not under test. Its last
    sighting is set a minute ahead so that a slow machine cannot let it go stale before the
    decision reads it (staleness is not what these tests are about)."""
    r.hset(ce.inflight_key("elsewhere"), url, n)
    r.zadd(ce.ROUTERS, {"elsewhere": int(time.time() * 1000) + 60_000})


def _cfg(redis_url: str, **kw) -> RouterConfig:
    """A generous Redis timeout: a read that times out would make the router fall back to
    the consistent hash, which is not the decision under test."""
    return RouterConfig(workers=(A, B, C), redis=redis_url, model=None, redis_timeout=30.0,
                        **kw)


def _decide(cfg: RouterConfig, ids) -> str:
    async def go():
        rt = Router(cfg)
        try:
            d = await rt.decide_prompt(Prompt(ids))
        finally:
            await rt.stop()
        assert d.how != "fallback", "the decision fell back: Redis was not read"
        return d.url
    return asyncio.run(go())


def _route_then_decide(cfg: RouterConfig, routed, ids) -> tuple[str, str]:
    """One replica routes `routed` (its state writes finish), then a fresh one decides
    `ids` from Redis alone: (the first's worker, the second's)."""
    async def go():
        first = Router(cfg)
        try:
            d = await first.route(Prompt(routed))
            while first._writes:
                await asyncio.gather(*first._writes)
        finally:
            await first.stop()
        second = Router(cfg)
        try:
            return d.url, (await second.decide_prompt(Prompt(ids))).url
        finally:
            await second.stop()
    return asyncio.run(go())


def test_a_next_turn_follows_its_history_and_a_shared_prefix_does_not(redis_server):
    r = redis.Redis.from_url(redis_server.url)
    _publish(r, A, "a1", HISTORY)
    _publish(r, B, "b1")
    _publish(r, C, "c1")
    cfg = _cfg(redis_server.url)
    # A holds HISTORY and nothing is in flight: affinity alone sends HISTORY there, and a
    # fresh replica sends the next turn after it.
    assert _route_then_decide(cfg, HISTORY, NEXT_TURN) == (A, A)
    # 3 requests in flight on A (another replica's), B and C idle. The next turn runs
    # through the routed prompt's end, so it continues it and follows it onto the busy
    # worker: 2 x 320/361 - 3/2 against 0 (without the mark: 320/361 - 3/2).
    _busy(r, A, 3)
    assert _decide(cfg, NEXT_TURN) == A
    # A prompt sharing only half of that history is copied to an idle worker.
    assert _decide(cfg, SHARED_ONLY) in (B, C)
    # At weight 1 the load wins for the next turn too.
    plain = _cfg(redis_server.url, continuation_weight=1.0)
    assert _decide(plain, NEXT_TURN) in (B, C)
    # A restarts with the same pages but a new incarnation: no continuation marks of the
    # old one are read, so the load wins.
    _publish(r, A, "a2", HISTORY)
    assert _decide(cfg, NEXT_TURN) in (B, C)
    r.close()


def test_without_a_routed_earlier_request_the_same_history_is_not_a_continuation(
        redis_server):
    r = redis.Redis.from_url(redis_server.url)
    _publish(r, A, "a1", HISTORY)
    _publish(r, B, "b1")
    _publish(r, C, "c1")
    _busy(r, A, 3)
    cfg = _cfg(redis_server.url)
    # A holds the pages but no router routed a prompt ending there: no continuation.
    assert _decide(cfg, NEXT_TURN) in (B, C)
    r.close()
