"""The routers' shared state in Redis (names: cache_events.py).

What one decision reads, in two round trips: the workers' heartbeats and the live routers
(one hash slot), then every live router's in-flight counts and, per worker, which of the
prompt's page keys its current incarnation holds (full KV, live SWA; the same in its host
tier when it has one) and which the shared store it loads from holds (once per store). Every
replica reads the same keys, so replicas on one Redis decide alike; nothing that matters
lives in a router.

In-flight requests: each router keeps its own counts (authoritative) and mirrors them in a
hash with a TTL, so a router that dies stops counting after the TTL. Per request it sends an
HINCRBY; after Redis was away it rewrites the hash whole (`sync`), which is the catch-up.
Any Redis failure raises `StateUnavailable`; the router then decides locally.

Responses: the worker that made each response a router relayed, for the next turn of its
chain and for reads through any replica (a day, as the workers' store keeps it by default).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from ..kvcache.tiers.keys import FULL, SWA
from ..redis_client import open_redis
from . import cache_events as ce

# A router's in-flight counts outlive it by this much (a killed router's requests weigh on
# their workers' load until then); renewed every health interval, so at least 3 of those.
ROUTER_TTL_MS = 3_000
SERVED = ce.PREFIX + ":resp:"   # + a Responses id: the worker that made it
END = "e"      # pending kind: the last page key of a routed prompt (kept CONTINUE_MS)


class StateUnavailable(Exception):
    """Redis did not answer in time or failed."""


@dataclass
class Heartbeat:
    incarnation: str
    fingerprint: bytes
    page_size: int
    window: int
    mode: str
    uncached_tokens: int = 0
    waiting: int = 0
    running: int = 0
    rebuild: int = 0
    host: bool = False          # it has a host tier (L2) and publishes its page sets
    store: str = ""             # the shared store (L3) it loads from (storage_id), or none

    @classmethod
    def parse(cls, raw: bytes) -> Heartbeat:
        d = json.loads(raw)
        return cls(d["incarnation"], bytes.fromhex(d["fingerprint"]), int(d["page_size"]),
                   int(d["window"]), d["mode"], int(d.get("uncached_tokens", 0)),
                   int(d.get("waiting", 0)), int(d.get("running", 0)),
                   int(d.get("rebuild", 0)), bool(d.get("host", False)),
                   str(d.get("store", "")))


@dataclass
class Held:
    """Which of a prompt's page keys one worker can serve, page by page: its tree's (full KV
    held, SWA live), the same with the pages requests in flight there will leave, whether the
    prompt continues a request routed there (runs through its prompt's end), and its host
    tier's and shared store's (None: no such tier)."""
    full: list[bool]
    swa: list[bool]
    full_p: list[bool]
    swa_p: list[bool]
    cont: bool
    l2: tuple[list[bool], list[bool]] | None = None
    l3: tuple[list[bool], list[bool]] | None = None


@dataclass
class Snapshot:
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    inflight: dict[str, int] = field(default_factory=dict)   # other routers', per worker


class RouterState:
    def __init__(self, url: str, router_id: str, timeout: float, renew: float = 1.0):
        self.url, self.id, self.timeout = url, router_id, timeout
        self.ttl_ms = max(ROUTER_TTL_MS, int(3000 * renew))
        self.client = open_redis(url)
        self.errors: dict[str, int] = {}
        self.need_sync = True

    async def _run(self, op: str, coro):
        try:
            return await asyncio.wait_for(coro, self.timeout)
        except Exception as e:  # noqa: BLE001 - every Redis failure is the same to a router
            self.errors[op] = self.errors.get(op, 0) + 1
            self.need_sync = True
            raise StateUnavailable(f"{op}: {e!r}") from e

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # noqa: BLE001
            pass

    # ---- membership --------------------------------------------------------------------
    async def members(self) -> set[str]:
        raw = await self._run("members", self.client.smembers(ce.WORKERS))
        return {m.decode() for m in raw}

    async def add_worker(self, url: str) -> None:
        await self._run("members", self.client.sadd(ce.WORKERS, url))

    async def remove_worker(self, url: str) -> None:
        await self._run("members", self.client.srem(ce.WORKERS, url))

    # ---- one decision ------------------------------------------------------------------
    async def read(self, workers: list[str], keys_by_fp) -> tuple[Snapshot, dict[str, Held]]:
        """(heartbeats and in-flight counts, {worker: what it can serve of the prompt}).
        `keys_by_fp(fingerprint, page_size)`: the prompt's page keys under them."""
        return await self._run("read", self._read(workers, keys_by_fp))

    async def _read(self, workers, keys_by_fp):
        c, now = self.client, int(time.time() * 1000)
        pipe = c.pipeline(transaction=False)
        for w in workers:
            pipe.get(ce.heartbeat_key(w))
        pipe.zrangebyscore(ce.ROUTERS, now - self.ttl_ms, "+inf")
        res = await pipe.execute()
        snap = Snapshot()
        for w, raw in zip(workers, res[:len(workers)]):
            if raw is not None:
                snap.heartbeats[w] = Heartbeat.parse(raw)
        routers = [r.decode() for r in res[-1] if r.decode() != self.id]   # ours: in memory
        pipe = c.pipeline(transaction=False)
        for r in routers:
            pipe.hgetall(ce.inflight_key(r))
        asks: list[tuple[str, str]] = []      # (what, whose): in the pipeline's order
        stores: set[str] = set()
        for w, hb in snap.heartbeats.items():
            keys = keys_by_fp(hb.fingerprint, hb.page_size)
            if not keys or hb.mode == "off":
                continue
            asks.append(("l1", w))
            for kind in (FULL, SWA):
                pipe.smismember(ce.pages_key(hb.incarnation, kind), keys)
                pipe.zmscore(ce.pending_key(hb.incarnation, kind), keys)
            pipe.zmscore(ce.pending_key(hb.incarnation, END), keys)
            if hb.host:
                asks.append(("l2", w))
                for kind in (ce.L2_FULL, ce.L2_SWA):
                    pipe.smismember(ce.pages_key(hb.incarnation, kind), keys)
            if hb.store and hb.store not in stores:     # a store's id names its keys too
                stores.add(hb.store)
                asks.append(("l3", hb.store))
                for kind in (FULL, SWA):
                    pipe.smismember(ce.l3_key(hb.store, kind), keys)
        res = await pipe.execute() if routers or asks else []
        for counts in res[:len(routers)]:
            for w, n in counts.items():
                snap.inflight[w.decode()] = snap.inflight.get(w.decode(), 0) + int(n)
        pages: dict[str, Held] = {}
        l2: dict[str, tuple[list[bool], list[bool]]] = {}
        l3: dict[str, tuple[list[bool], list[bool]]] = {}
        j = len(routers)
        for what, who in asks:
            if what == "l1":
                f, pf, s, ps, pe = res[j:j + 5]
                j += 5
                pages[who] = Held(
                    [bool(a) for a in f], [bool(a) for a in s],
                    [bool(a) or (b is not None and b > now) for a, b in zip(f, pf)],
                    [bool(a) or (b is not None and b > now) for a, b in zip(s, ps)],
                    any(b is not None and b > now for b in pe))
            else:
                f, s = res[j:j + 2]
                j += 2
                (l2 if what == "l2" else l3)[who] = ([bool(a) for a in f], [bool(a) for a in s])
        for w, held in pages.items():
            held.l2 = l2.get(w)
            held.l3 = l3.get(snap.heartbeats[w].store)
        return snap, pages

    async def mark_pending(self, incarnation: str, full: list[bytes], swa: list[bytes],
                           end: bytes, ttl_ms: int, end_ttl_ms: int) -> None:
        """Pages a request now in flight will leave cached on the worker, for `ttl_ms`, and
        its prompt's last page key (a later request through it continues this one), for
        `end_ttl_ms`."""
        async def go():
            now = int(time.time() * 1000)
            pipe = self.client.pipeline(transaction=False)
            for kind, keys, ttl in ((FULL, full, ttl_ms), (SWA, swa, ttl_ms),
                                    (END, [end], end_ttl_ms)):
                if keys:
                    name, until = ce.pending_key(incarnation, kind), now + ttl
                    pipe.zadd(name, {k: until for k in keys})
                    pipe.zremrangebyscore(name, "-inf", until - 2 * ttl)
                    pipe.pexpire(name, 2 * ttl)
            await pipe.execute()
        await self._run("pending", go())

    # ---- Responses' makers ----------------------------------------------------------------
    async def note_served(self, response_id: str, url: str, ttl_ms: int) -> None:
        await self._run("served", self.client.set(SERVED + response_id, url, px=ttl_ms))

    async def served_by(self, response_id: str) -> str | None:
        raw = await self._run("served", self.client.get(SERVED + response_id))
        return raw.decode() if raw is not None else None

    # ---- in-flight ---------------------------------------------------------------------
    async def inflight_add(self, worker: str, n: int) -> None:
        await self._run("inflight", self.client.hincrby(ce.inflight_key(self.id), worker, n))

    async def sync(self, local: dict[str, int]) -> None:
        """Announce this router, renew its in-flight hash, and rewrite it whole after an
        outage (increments sent while Redis was away are lost)."""
        c, key = self.client, ce.inflight_key(self.id)

        async def go():
            if self.need_sync:
                pipe = c.pipeline(transaction=False)
                pipe.delete(key)
                live = {w: n for w, n in local.items() if n}
                if live:
                    pipe.hset(key, mapping=live)
                await pipe.execute()
            pipe = c.pipeline(transaction=False)
            pipe.pexpire(key, self.ttl_ms)
            pipe.zadd(ce.ROUTERS, {self.id: int(time.time() * 1000)})
            pipe.zremrangebyscore(ce.ROUTERS, "-inf", int(time.time() * 1000) - 6 * self.ttl_ms)
            await pipe.execute()
            self.need_sync = False
        await self._run("sync", go())
