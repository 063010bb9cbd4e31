"""RedisStore against real redis-server processes: a server that stops answering (deadline),
one killed mid-run and restarted (misses, then hits again, same store object), a full Redis
(noeviction: dropped writes), a small allkeys-lru Redis (keep-alive touches keep hot keys),
a password in the URL."""
from __future__ import annotations

import asyncio
import random
import socket

import pytest
from helpers.redis_servers import RedisServer
from helpers.stalls import stall_after_first_client

from mimo.kvcache.tiers.redis_store import RedisStore
from mimo.kvcache.tiers.storage import open_storage

T = 5.0
GUARD = 10.0    # an operation that takes this long has hung: the deadline was not kept


@pytest.fixture
def server():
    s = RedisServer()
    try:
        yield s
    finally:
        s.stop()


def _items(prefix: str, n: int, size: int, seed: int = 0) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    return [(f"{prefix}/{i}", rng.randbytes(size)) for i in range(n)]


async def _guarded(coro):
    return await asyncio.wait_for(coro, GUARD)


def test_a_server_that_stops_answering_gives_timeouts_then_recovers(server):
    # socket timeouts far beyond the deadline: only the store's deadline can end the batch
    store = RedisStore(server.url, socket_timeout=60.0, backoff=1.0)
    items = _items("p", 20, 50_000)
    keys = [k for k, _ in items]

    async def main():
        try:
            assert await store.put(items, T) == [True] * 20
            server.pause()
            try:
                got = await _guarded(store.get(keys, 0.3))
                # a node that let a batch run past its deadline is skipped for the backoff
                skipped = await _guarded(store.exists(keys[:2], 0.3))
                await asyncio.sleep(1.1)
                stored = await _guarded(store.put(_items("q", 3, 10), 0.3))    # tried again
            finally:
                server.resume()
            await asyncio.sleep(1.1)        # past the backoff
            # replies to the abandoned batches must not leak into new ones
            return got, stored, skipped, await store.get(keys, T)
        finally:
            await store.aclose()

    got, stored, skipped, after = asyncio.run(main())
    assert got == [None] * 20 and stored == [False] * 3 and skipped == [False, False]
    assert after == [v for _, v in items]
    e = store.stats.errors
    assert (e["timeout"], e["unavailable"]) == (23, 2)
    assert store.stats.dropped == 3 and store.stats.hits == 20


def test_a_socket_that_never_answers_gives_timeouts():
    with socket.socket() as listener:     # the kernel accepts; nobody ever reads or replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=60.0)

        async def main():
            try:
                return await _guarded(store.get(["a", "b", "c"], 0.3))
            finally:
                await store.aclose()
        assert asyncio.run(main()) == [None, None, None]
    assert store.stats.errors["timeout"] == 3 and store.stats.misses == 3


def test_killed_mid_run_misses_then_hits_after_restart(server):
    store = open_storage(server.url)
    assert isinstance(store, RedisStore)

    async def main():
        try:
            outcomes = []
            for step in range(30):
                if step == 10:
                    server.kill()
                if step == 20:
                    server.restart()        # same port, empty (no persistence)
                    await asyncio.sleep(0.6)    # let the backoff of the last failure run out
                batch = _items(f"s{step}", 4, 20_000, seed=step)
                ok = await _guarded(store.put(batch, T))
                got = await _guarded(store.get([k for k, _ in batch], T))
                outcomes.append((step, ok, got == [v for _, v in batch]))
                await asyncio.sleep(0.02)
            return outcomes
        finally:
            await store.aclose()

    outcomes = asyncio.run(main())
    for step, ok, hit in outcomes:
        up = step < 10 or step >= 20
        assert ok == [up] * 4 and hit == up, step
    s = store.stats
    assert s.dropped == 40 and s.errors["unavailable"] == 80    # 40 writes + 40 reads
    assert s.misses == 40 and s.hits == 80


def test_a_full_redis_drops_writes_counted_full():
    with RedisServer(maxmemory="2mb", policy="noeviction") as server:
        store = open_storage(server.url)
        items = _items("f", 60, 64 << 10)      # ~4 MB into a 2 MB Redis that never evicts

        async def main():
            try:
                ok = await store.put(items, T)
                return ok, await store.get([k for k, _ in items], T)
            finally:
                await store.aclose()
        ok, got = asyncio.run(main())
    assert 0 < sum(ok) < 60
    assert [g is not None for g in got] == ok       # what was stored reads back
    assert all(g == v for g, (_, v) in zip(got, items) if g is not None)
    s = store.stats
    assert s.errors["full"] == 60 - sum(ok) == s.dropped and sum(s.errors.values()) == s.dropped


def test_keep_alive_touches_keep_hot_keys_in_a_small_lru_redis():
    """allkeys-lru at 2 MB (about 1 MB of it for data). Redis's LRU clock ticks once a second,
    so the cold keys are written in generations a second apart, the hot keys touched before
    each; a control set written with the hot keys is never touched."""
    with RedisServer(maxmemory="2mb", policy="allkeys-lru",
                     args=("--maxmemory-samples", "10")) as server:
        store = open_storage(server.url)
        hot, control = _items("hot", 8, 16 << 10, 1), _items("control", 8, 16 << 10, 2)

        async def main():
            try:
                assert all(await store.put(hot + control, T))
                cold = []
                for gen in range(4):        # 4 x 640 KB: far more than the data room
                    await asyncio.sleep(1.05)
                    await store.touch([k for k, _ in hot], T)
                    batch = _items(f"cold{gen}", 40, 16 << 10, 10 + gen)
                    cold += [k for k, _ in batch]
                    for j in range(0, 40, 4):
                        assert all(await store.put(batch[j:j + 4], T))
                return (await store.get([k for k, _ in hot], T),
                        await store.exists([k for k, _ in control], T),
                        await store.exists(cold, T))
            finally:
                await store.aclose()
        got_hot, control_alive, cold_alive = asyncio.run(main())
    assert sum(g == v for g, (_, v) in zip(got_hot, hot)) >= 6     # nearly all stay
    assert sum(control_alive) <= 2                                # nearly all evicted
    assert sum(cold_alive) <= 0.5 * len(cold_alive)


def test_password_in_url_is_used_and_never_shown():
    with RedisServer(args=("--requirepass", "s3cret")) as server:
        good = open_storage(f"redis://:s3cret@127.0.0.1:{server.port}/0")
        bad = open_storage(f"redis://:wrong@127.0.0.1:{server.port}/0")
        assert "s3cret" not in good.describe() and "wrong" not in bad.describe()

        async def main():
            try:
                assert await good.put([("k", b"v")], T) == [True]
                return await good.get(["k"], T), await bad.get(["k"], T)
            finally:
                await good.aclose()
                await bad.aclose()
        assert asyncio.run(main()) == ([b"v"], [None])
    assert bad.stats.errors["unavailable"] == 1


def test_a_connection_the_loop_notices_late_lands_within_the_deadline(server, monkeypatch):
    """The batch has 2 s and the loop notices its new connection 0.8 s late: the client's
    connect timeout is the tier's deadline (`open_storage`'s `timeout`), so the write lands;
    a 0.5 s connect timeout of its own failed the whole batch."""
    stall_after_first_client(monkeypatch, 0.8)
    store = open_storage(server.url, timeout=2.0)

    async def main():
        try:
            return await _guarded(store.put(_items("s", 8, 100), 2.0))
        finally:
            await store.aclose()
    assert asyncio.run(main()) == [True] * 8
