"""Where stored responses live, chosen by the URL scheme of `--responses-store`: this
process's memory (the default, or `memory://`) or Redis (`redis://HOST:PORT[/DB]`, `rediss://`),
which every replica behind the router shares, so any replica continues any chain.

A record is a JSON object (the Response, its input items, the chain's context); every entry
expires `ttl` seconds after it was written. Memory also bounds its total size: the least
recently used records go first. A store that cannot be reached raises StoreUnavailable
(answered 503), never a silent miss: a miss is a 400 or 404 the client acts on.
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Protocol
from urllib.parse import urlparse

from ...config import check_responses_store

MEMORY_BYTES = 256 * 2**20      # the memory store's bound on its records' JSON size
_PREFIX = "mimo:responses:"


class StoreUnavailable(Exception):
    """The store did not answer (Redis down or unreachable)."""


class ResponseStore(Protocol):
    async def get(self, rid: str) -> dict | None: ...

    async def put(self, rid: str, record: dict) -> None: ...

    async def delete(self, rid: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Records in this process; `ttl` seconds each, `max_bytes` of JSON in all (LRU)."""

    def __init__(self, ttl: float, max_bytes: int = MEMORY_BYTES, clock=time.monotonic):
        self.ttl, self.max_bytes, self.clock = ttl, max_bytes, clock
        self._data: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.bytes = 0

    def _drop(self, rid: str) -> None:
        _, raw = self._data.pop(rid)
        self.bytes -= len(raw)

    async def get(self, rid: str) -> dict | None:
        hit = self._data.get(rid)
        if hit is None:
            return None
        if hit[0] <= self.clock():
            self._drop(rid)
            return None
        self._data.move_to_end(rid)
        return json.loads(hit[1])

    async def put(self, rid: str, record: dict) -> None:
        raw = json.dumps(record, ensure_ascii=False)
        if rid in self._data:
            self._drop(rid)
        self._data[rid] = (self.clock() + self.ttl, raw)
        self.bytes += len(raw)
        while self.bytes > self.max_bytes and len(self._data) > 1:
            self._drop(next(iter(self._data)))

    async def delete(self, rid: str) -> bool:
        live = await self.get(rid) is not None
        if rid in self._data:
            self._drop(rid)
        return live

    async def close(self) -> None:
        self._data.clear()
        self.bytes = 0


class RedisStore:
    """Records as JSON strings under `mimo:responses:<id>`, SET with EX ttl."""

    def __init__(self, url: str, ttl: float):
        import redis.asyncio as aredis
        self.url, self.ttl = url, max(1, int(round(ttl)))
        self._client = aredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)

    async def _call(self, fn, *args, **kw):
        from redis.exceptions import RedisError
        try:
            return await fn(*args, **kw)
        except (RedisError, OSError) as e:
            raise StoreUnavailable(f"responses store {self._where()} unavailable: "
                                   f"{type(e).__name__}") from None

    def _where(self) -> str:
        u = urlparse(self.url)
        return f"{u.scheme}://{u.hostname}:{u.port or 6379}"     # no password in messages

    async def get(self, rid: str) -> dict | None:
        raw = await self._call(self._client.get, _PREFIX + rid)
        return None if raw is None else json.loads(raw)

    async def put(self, rid: str, record: dict) -> None:
        await self._call(self._client.set, _PREFIX + rid,
                         json.dumps(record, ensure_ascii=False), ex=self.ttl)

    async def delete(self, rid: str) -> bool:
        return bool(await self._call(self._client.delete, _PREFIX + rid))

    async def close(self) -> None:
        try:
            await self._client.aclose()
        except Exception:   # noqa: BLE001 - closing a client whose server is gone
            pass


def open_store(url: str | None, ttl: float) -> ResponseStore:
    check_responses_store(url)
    if url is None or url == "memory://":
        return MemoryStore(ttl)
    return RedisStore(url, ttl)
