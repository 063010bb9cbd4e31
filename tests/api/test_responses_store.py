"""The Responses stores on their own: memory (TTL on a fake clock, the LRU size bound) and
Redis (a real redis-server: records round-trip, every key has the TTL, a dead server is
StoreUnavailable, never a miss), chosen by URL scheme; bad URLs are config errors."""
from __future__ import annotations

import asyncio

import pytest
from helpers.redis_servers import RedisServer

from mimo.api.responses.store import (
    MemoryStore,
    RedisStore,
    StoreUnavailable,
    open_store,
)
from mimo.config import ConfigError, ServerConfig


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(coro):
    return asyncio.run(coro)


def test_memory_ttl_and_delete():
    clock = Clock()
    s = MemoryStore(ttl=10, clock=clock)
    rec = {"response": {"id": "r1"}, "context": [{"a": "é"}]}
    run(s.put("r1", rec))
    assert run(s.get("r1")) == rec
    clock.t = 9.9
    assert run(s.get("r1")) == rec
    clock.t = 10.0
    assert run(s.get("r1")) is None and s.bytes == 0
    run(s.put("r2", rec))
    assert run(s.delete("r2")) is True
    assert run(s.delete("r2")) is False and run(s.get("r2")) is None


def test_memory_evicts_least_recently_used_beyond_its_bound():
    one = len('{"x": "' + "a" * 100 + '"}')
    s = MemoryStore(ttl=100, max_bytes=3 * one)
    for k in "abc":
        run(s.put(k, {"x": "a" * 100}))
    run(s.get("a"))                      # a is now the most recently used
    run(s.put("d", {"x": "a" * 100}))
    assert [run(s.get(k)) is not None for k in "abcd"] == [True, False, True, True]
    assert s.bytes == 3 * one


def test_redis_store_round_trip_ttl_and_outage():
    r = RedisServer()
    try:
        async def scenario():
            s = open_store(r.url, ttl=50)
            assert isinstance(s, RedisStore)
            rec = {"response": {"id": "r1"}, "context": [{"t": "ü" * 3}]}
            await s.put("r1", rec)
            assert await s.get("r1") == rec
            assert await s.get("nope") is None
            ttl = r.client().ttl("mimo:responses:r1")
            assert 0 < ttl <= 50
            assert await s.delete("r1") is True and await s.delete("r1") is False
            r.kill()
            for op in (s.get("r1"), s.put("r1", rec), s.delete("r1")):
                with pytest.raises(StoreUnavailable):
                    await op
            await s.close()
        run(scenario())
    finally:
        r.stop()


@pytest.mark.parametrize("url", [None, "memory://"])
def test_memory_is_the_default(url):
    assert isinstance(open_store(url, 5), MemoryStore)


@pytest.mark.parametrize("url", ["http://h:1", "redis://", "redis://h:notaport", "memory"])
def test_bad_store_urls_are_config_errors(url):
    with pytest.raises(ConfigError):
        ServerConfig(responses_store=url)
    with pytest.raises(ConfigError):
        open_store(url, 5)


def test_ttl_must_be_positive():
    with pytest.raises(ConfigError):
        ServerConfig(responses_ttl=0)
