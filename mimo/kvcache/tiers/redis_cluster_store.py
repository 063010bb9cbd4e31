"""RedisClusterStore: L3 entries in a Redis Cluster.

redis.asyncio.cluster.RedisCluster provides only the topology (slot -> master); the commands
go through one plain client per master (RedisNode), so a batch is grouped per node, each
node's share is one pipeline (multi-key commands per slot), and the nodes run concurrently
under the batch's deadline. A dead or hung master costs only the keys of its slots
("unavailable" or "timeout"); the library's own cluster retry loop (which sleeps,
reinitialises and retries the whole command on any node error) is never entered.

The topology is fetched on first use and refreshed in the background, at most once per
`refresh_interval`, after a node fails or answers MOVED/ASK/CLUSTERDOWN/TRYAGAIN (a failover
or resharding moved slots). Until the refresh lands the moved keys miss.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from ...redis_client import parse_cluster_url
from .redis_store import Plan, RedisNode, RoutedRedisStore, no_retry_options

log = logging.getLogger(__name__)


class RedisClusterStore(RoutedRedisStore):
    scheme = "redis-cluster"

    def __init__(self, url: str, *, connect_timeout: float = 0.5, socket_timeout: float = 2.0,
                 backoff: float = 0.5, refresh_interval: float = 1.0):
        super().__init__(backoff=backoff)
        self.startup, self._user, self._password = parse_cluster_url(url)
        self.refresh_interval = refresh_interval
        self._opts = no_retry_options(connect_timeout, socket_timeout)
        self._topology: RedisCluster | None = None
        self._ready = False
        self._init: asyncio.Task[None] | None = None
        self._init_failed_at = float("-inf")
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_at = float("-inf")
        self.nodes: dict[str, RedisNode] = {}       # "host:port" -> node, made on first use

    def describe(self) -> str:
        return "redis-cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup)

    # ---- topology -----------------------------------------------------------------------
    def _make_topology(self) -> RedisCluster:
        # only its topology calls (CLUSTER SLOTS, COMMAND) ever run, without retries
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.startup],
                            username=self._user, password=self._password,
                            require_full_coverage=False, **self._opts)

    async def _initialize(self) -> None:
        self._topology = self._topology or self._make_topology()
        await self._topology.initialize()
        self._ready = True
        self._refreshed_at = asyncio.get_running_loop().time()

    async def _ensure_topology(self, deadline: float) -> BaseException | None:
        """None once the topology is known; else why not (the keys miss with that cause)."""
        if self._ready:
            return None
        loop = asyncio.get_running_loop()
        if self._init is None or (self._init.done() and
                                  loop.time() - self._init_failed_at >= self.backoff):
            self._init = asyncio.ensure_future(self._initialize())
        if not self._init.done():
            # shielded: a short deadline must not cancel the fetch the next batch will use
            done, _ = await asyncio.wait([self._init], timeout=self._remaining(deadline))
            if not done:
                return asyncio.TimeoutError("cluster topology not fetched by the deadline")
        exc = self._init.exception()
        if exc is not None:
            self._init_failed_at = loop.time()
            return exc
        return None

    def _node_failed(self, node: RedisNode, exc: BaseException) -> None:
        loop = asyncio.get_running_loop()
        if not self._ready or (self._refresh is not None and not self._refresh.done()):
            return
        if loop.time() - self._refreshed_at < self.refresh_interval:
            return
        self._refreshed_at = loop.time()
        self._refresh = asyncio.ensure_future(self._refresh_topology())

    async def _refresh_topology(self) -> None:
        assert self._topology is not None
        try:
            await self._topology.nodes_manager.initialize()
        except Exception as e:     # keep the old map; the next failure tries again
            log.debug("Redis Cluster topology refresh failed: %r", e)

    def _node(self, host: str, port: int) -> RedisNode:
        name = f"{host}:{port}"
        node = self.nodes.get(name)
        if node is None:
            opts = dict(self._opts, host=host, port=port, username=self._user,
                        password=self._password)
            node = self.nodes[name] = RedisNode(name, lambda: Redis(**opts), self.backoff)
        return node

    async def _plan(self, keys: Sequence[str], deadline: float
                    ) -> tuple[Plan, dict[int, BaseException]]:
        why = await self._ensure_topology(deadline)
        if why is not None:
            return [], {i: why for i in range(len(keys))}
        assert self._topology is not None
        manager = self._topology.nodes_manager
        by_node: dict[str, tuple[RedisNode, dict[int, list[int]]]] = {}
        unrouted: dict[int, BaseException] = {}
        for i, key in enumerate(keys):
            slot = key_slot(key.encode())
            try:
                primary = manager.get_node_from_slot(slot)
            except rexc.SlotNotCoveredError as e:
                unrouted[i] = e
                continue
            node = self._node(primary.host, int(primary.port))
            by_node.setdefault(node.name, (node, {}))[1].setdefault(slot, []).append(i)
        return [(node, list(slots.values())) for node, slots in by_node.values()], unrouted

    async def aclose(self) -> None:
        for task in (self._init, self._refresh):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for node in self.nodes.values():
            await node.aclose()
        if self._topology is not None:
            await self._topology.aclose()
        self._topology, self._ready, self._init, self._refresh = None, False, None, None
        self._loop = None
