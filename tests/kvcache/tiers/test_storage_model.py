"""Every L3 backend against a plain dict: random batches of put/get/exists/touch/delete with
payloads of 0 .. 1 MiB, over a few seeds; then stored entries tampered with behind the
backend's back (on disk, or SET through a raw client) are misses counted "corrupt", and gone."""
from __future__ import annotations

import asyncio
import os
import random
import struct

import pytest
from helpers.redis_servers import RedisCluster3, RedisServer

from mimo.kvcache.tiers import entry, storage
from mimo.kvcache.tiers.file_store import FileStore
from mimo.kvcache.tiers.storage import CAUSES, KVStorage, open_storage

T = 5.0     # deadline of every batch: generous, nothing here should time out


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster3()
    try:
        yield c
    finally:
        c.stop()


class Raw:
    """Reads and writes a backend's stored blobs directly, bypassing the store."""

    def __init__(self, backend: str, store: KVStorage, request):
        self.backend, self.store = backend, store
        if backend == "redis":
            self.server = request.getfixturevalue("redis_server")
        elif backend == "redis-cluster":
            self.cluster = request.getfixturevalue("cluster")

    def _client(self, key: str):
        if self.backend == "redis":
            return self.server.client()
        return self.cluster.nodes[self.cluster.node_of([key])[0]].client()

    def get(self, key: str) -> bytes | None:
        if self.backend == "file":
            assert isinstance(self.store, FileStore)
            try:
                with open(self.store.path_of(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        with self._client(key) as c:
            return c.get(key)

    def set(self, key: str, blob: bytes) -> None:
        if self.backend == "file":
            assert isinstance(self.store, FileStore)
            with open(self.store.path_of(key), "wb") as f:     # in place, size may change
                f.write(blob)
            return
        with self._client(key) as c:
            c.set(key, blob)


@pytest.fixture(params=["file", "redis", "redis-cluster"])
def backend(request, tmp_path):
    if request.param == "file":
        url = f"file:{tmp_path / 'kv'}"
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        with server.client() as c:
            c.flushall()
        url = server.url
    else:
        cluster = request.getfixturevalue("cluster")
        for n in cluster.nodes:
            with n.client() as c:
                c.flushall()
        url = cluster.url
    store = open_storage(url)
    assert store.scheme == request.param
    return store, Raw(request.param, store, request)


def _payload(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.05:
        return b""
    if r < 0.10:
        return rng.randbytes(1 << 20)
    if r < 0.25:
        return rng.randbytes(rng.randrange(64 << 10, 1 << 20))
    return rng.randbytes(rng.randrange(1, 64 << 10))


async def _differential(store: KVStorage, seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"seed{seed}/page/{i:03d}" for i in range(40)]
    model: dict[str, bytes] = {}
    for _ in range(60):
        op = rng.choice(["put", "put", "get", "get", "exists", "touch", "delete"])
        keys = rng.sample(pool, rng.randrange(1, 9))
        if op == "put":
            items = [(k, _payload(rng)) for k in keys]
            assert await store.put(items, T) == [True] * len(items)
            model.update(items)
        elif op == "get":
            assert await store.get(keys, T) == [model.get(k) for k in keys]
        elif op == "exists":
            assert await store.exists(keys, T) == [k in model for k in keys]
        elif op == "touch":
            await store.touch(keys, T)
        else:
            await store.delete(keys, T)
            for k in keys:
                model.pop(k, None)
    assert await store.get(pool, T) == [model.get(k) for k in pool]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_differential_against_a_dict(backend, seed):
    store, _ = backend

    async def main():
        try:
            await _differential(store, seed)
        finally:
            await store.aclose()
    asyncio.run(main())
    s = store.stats
    assert s.errors == {c: 0 for c in CAUSES}
    assert s.gets == s.hits + s.misses and s.puts == s.stored and s.dropped == 0
    assert s.deleted_corrupt == 0 and s.touches > 0
    store.check_integrity()


def _tampered(blob: bytes, other_key_blob: bytes) -> dict[str, bytes]:
    n = len(blob)
    flip = bytearray(blob)
    flip[entry.HEADER_SIZE + (n - entry.HEADER_SIZE) // 3] ^= 0x10
    magic = bytearray(blob)
    magic[1] ^= 0xFF
    return {"truncated": blob[: n // 2], "short header": blob[:11], "bit flip": bytes(flip),
            "bad magic": bytes(magic), "trailing bytes": blob + b"xyz", "empty": b"",
            "another key's entry": other_key_blob}


def test_corrupt_entries_are_misses_and_deleted(backend):
    store, raw = backend
    rng = random.Random(7)
    kinds = list(_tampered(b"x" * 100, b"").keys())
    items = [(f"corrupt/{kind}", rng.randbytes(20000 + i)) for i, kind in enumerate(kinds)]
    items.append(("good", rng.randbytes(5000)))
    items.append(("versioned", rng.randbytes(5000)))
    keys = [k for k, _ in items]

    async def main():
        try:
            assert all(await store.put(items, T))
            good_blob = raw.get("good")
            assert good_blob is not None
            for (key, _), kind in zip(items, kinds):
                blob = raw.get(key)
                assert blob is not None
                raw.set(key, _tampered(blob, good_blob)[kind])
            newer = bytearray(raw.get("versioned") or b"")
            struct.pack_into("<H", newer, 4, entry.VERSION + 1)
            raw.set("versioned", bytes(newer))

            got = await store.get(keys, T)
            assert got == [None] * len(kinds) + [items[-2][1], None]
            # deleted, except the entry of another format version (not ours to remove)
            assert [raw.get(k) is None for k in keys] == [True] * len(kinds) + [False, False]
            assert await store.exists(keys, T) == [False] * len(kinds) + [True, True]
        finally:
            await store.aclose()
    asyncio.run(main())
    s = store.stats
    assert s.errors["corrupt"] == len(kinds) + 1
    assert s.deleted_corrupt == len(kinds)
    assert (s.hits, s.misses) == (1, len(kinds) + 1)
    store.check_integrity()


def test_open_storage_urls(tmp_path):
    assert open_storage(f"file:{tmp_path}").describe() == f"file:{tmp_path}"
    assert open_storage(f"file://{tmp_path}", disk_cap=10).describe() == \
        f"file:{tmp_path} (cap 10 bytes)"
    r = open_storage("redis://:hunter2@10.1.2.3:6380/4")
    assert r.scheme == "redis" and r.describe() == "redis://10.1.2.3:6380/4"
    assert open_storage("rediss://h:1").describe() == "rediss://h:1/0"
    c = open_storage("redis-cluster://:pw@a:1,b:2,c:3")
    assert c.scheme == "redis-cluster" and c.describe() == "redis-cluster://a:1,b:2,c:3"
    for bad in ["s3://bucket", "redis-cluster://a", "/plain/path", "file:"]:
        with pytest.raises(ValueError) as e:
            open_storage(bad)
        assert "file:" in str(e.value) or "HOST:PORT" in str(e.value) or "names no" in str(e.value)
    with pytest.raises(ValueError, match="redis-cluster://HOST:PORT"):
        open_storage("memcached://x:1")
    assert os.listdir(tmp_path) == []     # opening reads and creates nothing


def test_an_unknown_scheme_is_refused_naming_the_known_ones():
    for bad in ["memcached://x:1", "redis:h:1", "/plain/path", "FILE:/x"]:
        with pytest.raises(ValueError) as e:
            open_storage(bad)
        assert "known schemes file, redis, rediss, redis-cluster" in str(e.value), bad


def test_a_registered_scheme_gets_the_url_and_the_settings(monkeypatch, tmp_path):
    seen = []

    def factory(url, *, disk_cap, min_age, timeout):
        seen.append((url, disk_cap, min_age, timeout))
        return storage.STORES["file"].factory(f"file:{tmp_path}", disk_cap=disk_cap,
                                              min_age=min_age, timeout=timeout)

    monkeypatch.setitem(storage.STORES, "mem", storage.StoreScheme(factory, "mem://NAME"))
    assert open_storage("mem://x", disk_cap=7, min_age=2.0, timeout=3.5).describe() == \
        f"file:{tmp_path} (cap 7 bytes)"
    assert seen == [("mem://x", 7, 2.0, 3.5)]
    with pytest.raises(ValueError, match="mem"):
        open_storage("mem:x")       # registered as scheme://
