"""RedisClusterStore against a real 3-master cluster: keys spread over every master; with one
master killed (before and after the others flag it failed) or paused, exactly the keys of its
slots miss, by the batch's deadline, and every other key hits."""
from __future__ import annotations

import asyncio
import random

import pytest
from helpers.redis_servers import RedisCluster3
from helpers.stalls import stall_after_first_client

from mimo.kvcache.tiers.redis_cluster_store import RedisClusterStore
from mimo.kvcache.tiers.storage import open_storage

T = 5.0
GUARD = 10.0    # an operation that takes this long has hung: the deadline was not kept


@pytest.fixture(scope="module")
def cluster():
    """Shared by the tests that leave it whole (a paused master is resumed)."""
    c = RedisCluster3()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_cluster():
    c = RedisCluster3()
    try:
        yield c
    finally:
        c.stop()


def _items(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    return [(f"model-fp/page/{rng.getrandbits(64):016x}", rng.randbytes(rng.randrange(0, 30_000)))
            for _ in range(n)]


def test_keys_spread_over_all_masters_round_trip(cluster):
    store = open_storage(cluster.url)
    assert isinstance(store, RedisClusterStore)
    items = _items(300)
    keys = [k for k, _ in items]

    async def main():
        try:
            assert await store.put(items, T) == [True] * 300
            got = await store.get(keys, T)
            await store.touch(keys[:50], T)
            await store.delete(keys[:10], T)
            return got, await store.exists(keys, T)
        finally:
            await store.aclose()
    got, alive = asyncio.run(main())
    assert got == [v for _, v in items]
    assert alive == [False] * 10 + [True] * 290
    owners = cluster.node_of(keys)
    for i, node in enumerate(cluster.nodes):            # each master holds its own share
        with node.client() as c:
            assert c.dbsize() == sum(1 for o in owners[10:] if o == i) > 50
            c.flushall()
    assert sum(store.stats.errors.values()) == 0


def test_a_killed_master_costs_exactly_its_slots(fresh_cluster):
    cluster = fresh_cluster
    store = open_storage(cluster.url)
    items = _items(300, seed=1)
    keys = [k for k, _ in items]
    owners = cluster.node_of(keys)
    expect = [v if o != 1 else None for (_, v), o in zip(items, owners)]
    n_dead = owners.count(1)

    async def main():
        try:
            assert all(await store.put(items, T))
            cluster.kill(1)
            right_after = await asyncio.wait_for(store.get(keys, 1.0), GUARD)
            found = await asyncio.wait_for(store.exists(keys, 1.0), GUARD)
            # once the survivors flag it failed (cluster-require-full-coverage no: they go
            # on serving) and the store has refreshed its topology
            await asyncio.to_thread(cluster.wait_failed, 1)
            await asyncio.sleep(1.1)
            # the survivors' reads and writes get T: under a loaded machine's full suite a
            # 1 s deadline once missed a live key here (the dead master's keys fail at once)
            await asyncio.wait_for(store.get(keys, T), GUARD)
            later = await asyncio.wait_for(store.get(keys, T), GUARD)
            rewrite = await asyncio.wait_for(store.put(items, T), GUARD)
            return right_after, found, later, rewrite
        finally:
            await store.aclose()
    right_after, found, later, rewrite = asyncio.run(main())
    assert right_after == expect and later == expect
    assert found == [o != 1 for o in owners]
    assert rewrite == [o != 1 for o in owners]
    e = store.stats.errors
    assert e["unavailable"] + e["timeout"] == 5 * n_dead and e["corrupt"] == 0


def test_a_hung_master_costs_its_slots_by_the_deadline(cluster):
    store = RedisClusterStore(cluster.url, socket_timeout=60.0)
    items = _items(200, seed=2)
    keys = [k for k, _ in items]
    owners = cluster.node_of(keys)

    async def main():
        try:
            assert all(await store.put(items, T))
            cluster.pause(0)
            try:
                return await asyncio.wait_for(store.get(keys, 0.5), GUARD)
            finally:
                cluster.resume(0)
        finally:
            await store.aclose()
    got = asyncio.run(main())
    assert got == [v if o != 0 else None for (_, v), o in zip(items, owners)]
    assert store.stats.errors["timeout"] == owners.count(0)
    assert store.stats.hits == 200 - owners.count(0)


def test_unreachable_cluster_misses_and_does_not_raise():
    store = open_storage("redis-cluster://127.0.0.1:1,127.0.0.1:2")

    async def main():
        try:
            got = await asyncio.wait_for(store.get(["a", "b"], 1.0), GUARD)
            ok = await asyncio.wait_for(store.put([("a", b"x")], 1.0), GUARD)
            return got, ok
        finally:
            await store.aclose()
    assert asyncio.run(main()) == ([None, None], [False])
    assert store.stats.errors["unavailable"] == 3


def test_connections_the_loop_notices_late_land_within_the_deadline(cluster, monkeypatch):
    """The masters' connections open together; the loop stalls 0.8 s among them. With the
    tier's 2 s deadline as the clients' connect timeout every key lands (with 0.5 s of
    their own, every master's connection failed and so did the whole batch)."""
    stall_after_first_client(monkeypatch, 0.8)
    store = open_storage(cluster.url, timeout=2.0)
    items = _items(40, seed=9)

    async def main():
        try:
            return await asyncio.wait_for(store.put(items, 2.0), GUARD)
        finally:
            await store.aclose()
    assert asyncio.run(main()) == [True] * len(items)
