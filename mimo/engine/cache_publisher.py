"""A worker's side of the cache-aware router: its cache state and load, in Redis.

On the server's event loop, the publisher
- registers the worker (its advertised URL) in the routing set and starts a new
  *incarnation*: a fresh id whose page sets start empty, the previous incarnation's deleted.
  A restarted worker is never credited with the prefixes its old process held;
- writes the tree's changes (cache_mirror.TreeMirror) to that incarnation's two page
  sets (full KV held, SWA live), woken by every change so a conversation's next turn finds
  its previous turn published (one loopback round trip after the insert, well before the
  client has read the answer and sent the next request);
- sends a heartbeat every `interval` seconds with a TTL of `ttl`: the incarnation, the key
  fingerprint and page size, the window and cache mode the router predicts matches with,
  the tiers it can load from (a host tier; the shared store's `storage_id`) and the load
  (uncached prompt tokens queued and running). The page sets' TTL is renewed with it, so a
  dead worker's sets go away by themselves;
- with tiers (cache_mirror.TierMirror), writes its host tier's page sets (per
  incarnation, like the tree's) and what it learns of the shared store to that store's sets
  (shared by every worker on it: added to and removed from, never rewritten whole).
A Redis error loses nothing: the publisher retries with a back-off, and once Redis answers
again it rewrites the page sets whole from the mirror (changes made meanwhile included).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..kvcache.tiers.keys import FULL, SWA, KeyChain
from ..redis_client import open_redis
from ..router import cache_events as ce
from .cache_mirror import TierMirror, TreeMirror
from .face import EngineInfo, EngineStats

log = logging.getLogger(__name__)

_CHUNK = 2000       # members per SADD / SREM
# The shared store's sets outlive any one worker (the store does); renewed by heartbeats.
L3_TTL_MS = 3_600_000


class CachePublisher:
    def __init__(self, info: EngineInfo, stats: Callable[[], EngineStats], cache: object,
                 redis_url: str, url: str, interval: float = 0.5, ttl: float = 3.0) -> None:
        """`cache`: the engine's prefix cache, whose change events the mirrors follow
        (hooked here, before the engine thread starts); the load comes from `stats` (the
        engine's snapshot), never from the scheduler. Built by `AsyncEngine.publisher`."""
        self.stats, self.redis_url, self.url = stats, redis_url, url
        self.interval, self.ttl = interval, ttl
        self.incarnation = uuid.uuid4().hex[:16]
        tree = getattr(cache, "tree", None)
        self.mode = "off" if tree is None else tree.mode
        self.keys = KeyChain(info.fingerprint, info.page_size)
        self.mirror = TreeMirror(tree, self.keys) if tree is not None else None
        self.window = info.window
        self.rebuild = tree.rebuild if tree is not None else 0
        host, storage = getattr(cache, "host", None), getattr(cache, "storage", None)
        self.tiers = (TierMirror(host, storage)
                      if host is not None or storage is not None else None)
        self.has_host = host is not None
        store_url = getattr(getattr(cache, "cfg", None), "kv_storage", None)
        self.store = (ce.storage_id(self.keys.fingerprint, store_url)
                      if storage is not None and store_url else "")
        self.errors = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._started = False           # the incarnation is registered
        self._resync = True             # the page sets must be rewritten whole

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for m in (self.mirror, self.tiers):
            if m is not None:
                m.on_change = lambda: loop.call_soon_threadsafe(self._wake.set)
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            try:        # a graceful leave: routers drop this worker at once
                await asyncio.wait_for(self._client.delete(ce.heartbeat_key(self.url)), 1.0)
            except Exception:  # noqa: BLE001 - Redis away: the TTL does it
                pass
            await self._close()

    async def _close(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            try:
                await c.aclose()
            except Exception:  # noqa: BLE001
                pass

    async def _run(self) -> None:
        backoff, next_hb = 0.1, 0.0
        while True:
            try:
                if self._client is None:
                    self._client = open_redis(self.redis_url)
                if not self._started:
                    await self._begin()
                if self._resync or (self.mirror is not None and self.mirror.resync):
                    await self._write_all()
                else:
                    await self._flush()
                if time.monotonic() >= next_hb:
                    await self._heartbeat()
                    next_hb = time.monotonic() + self.interval
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis away or failing: retry, resync
                self.errors += 1
                self._resync = True
                log.warning("router state: %r; retrying in %.1f s", e, backoff)
                await self._close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), max(next_hb - time.monotonic(), 0))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    # ---- Redis writes -----------------------------------------------------------------
    async def _begin(self) -> None:
        c = self._client
        old = await c.get(ce.incarnation_key(self.url))
        if old is not None:
            old = old.decode()
            for kind in (FULL, SWA):      # what it held, and what routers expected of it
                await c.delete(ce.pages_key(old, kind), ce.pending_key(old, kind))
            await c.delete(ce.pages_key(old, ce.L2_FULL), ce.pages_key(old, ce.L2_SWA))
            await c.delete(ce.pending_key(old, "e"))
        await c.set(ce.incarnation_key(self.url), self.incarnation)
        self._started = True

    async def _write_all(self) -> None:
        snap = self.mirror.snapshot() if self.mirror is not None else {FULL: [], SWA: []}
        c = self._client
        await c.sadd(ce.WORKERS, self.url)     # again after Redis lost its data
        await c.set(ce.incarnation_key(self.url), self.incarnation)
        for kind in (FULL, SWA):
            name = ce.pages_key(self.incarnation, kind)
            await c.delete(name)
            members = snap[kind]
            for i in range(0, len(members), _CHUNK):
                await c.sadd(name, *members[i:i + _CHUNK])
        if self.tiers is not None:
            tiers = self.tiers.snapshot()
            for kind, members in tiers.items():
                if kind in (FULL, SWA) and not self.store:
                    continue
                name = self._tier_set(kind)
                if kind in (ce.L2_FULL, ce.L2_SWA):
                    await c.delete(name)
                for i in range(0, len(members), _CHUNK):
                    await c.sadd(name, *members[i:i + _CHUNK])
        self._resync = False

    def _tier_set(self, kind: str) -> str:
        if kind in (ce.L2_FULL, ce.L2_SWA):
            return ce.pages_key(self.incarnation, kind)
        return ce.l3_key(self.store, kind)

    async def _flush(self) -> None:
        ops: dict[tuple[str, bool], list[bytes]] = {}
        for m, name_of in ((self.mirror, lambda kind: ce.pages_key(self.incarnation, kind)),
                           (self.tiers, self._tier_set)):
            if m is None:
                continue
            for (kind, key), present in m.drain().items():
                if kind in (FULL, SWA) and m is self.tiers and not self.store:
                    continue
                ops.setdefault((name_of(kind), present), []).append(key)
        if not ops:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for (name, present), members in ops.items():
                for i in range(0, len(members), _CHUNK):
                    part = members[i:i + _CHUNK]
                    pipe.sadd(name, *part) if present else pipe.srem(name, *part)
            await pipe.execute()
        except BaseException:
            self._resync = True     # this delta is lost from Redis: rewrite everything
            raise

    def load(self) -> dict[str, int]:
        """Uncached prompt tokens queued and still to prefill, and the request counts, as
        of the engine's latest iteration (its snapshot)."""
        st = self.stats()
        return {"uncached_tokens": st.uncached_tokens, "waiting": st.waiting,
                "running": st.running}

    async def _heartbeat(self) -> None:
        hb = {"incarnation": self.incarnation, "fingerprint": self.keys.fingerprint.hex(),
              "page_size": self.keys.P, "window": self.window, "mode": self.mode,
              "rebuild": self.rebuild, "host": self.has_host, "store": self.store,
              "interval": self.interval, "time": time.time(), **self.load()}
        c, ms = self._client, int(self.ttl * 1000)
        pipe = c.pipeline(transaction=False)
        pipe.set(ce.heartbeat_key(self.url), json.dumps(hb), px=ms)
        await pipe.execute()
        pipe = c.pipeline(transaction=False)
        for kind in (FULL, SWA, ce.L2_FULL, ce.L2_SWA):
            pipe.pexpire(ce.pages_key(self.incarnation, kind), ms * 20)
        if self.store:
            for kind in (FULL, SWA):
                pipe.pexpire(ce.l3_key(self.store, kind), L3_TTL_MS)
        await pipe.execute()
