"""RedisStore: L3 entries in one Redis server, through redis.asyncio.

Every batch is one pipelined round trip (MGET for gets, one SET per entry for puts, EXISTS per
key, one TOUCH / DEL for all keys). The client retries nothing: the deadline, not the library,
decides how long an operation may take. A server that fails (refused, reset, an answer past
the deadline) is skipped for `backoff` seconds, every key a miss at once ("unavailable"),
then tried again; the connection pool reconnects by itself when the server is back.

RoutedRedisStore holds what this store shares with the cluster store: keys are routed to
RedisNodes, one pipeline per node, the nodes run concurrently under one deadline.
"""
from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import entry
from .storage import KVStorage, Payload, StorageStats

# One command: the name and its arguments, as redis-py's execute_command takes them.
Command = tuple[Any, ...]
# For each node, the key indices it serves, in groups that may share one multi-key command
# (a cluster command's keys must all hash to one slot).
Plan = list[tuple["RedisNode", list[list[int]]]]


class NodeDown(rexc.ConnectionError):
    """The node failed recently and is skipped until its backoff ends."""


def cause_of(exc: BaseException) -> str:
    """The miss cause a Redis failure counts as."""
    if isinstance(exc, rexc.OutOfMemoryError):
        return "full"
    if isinstance(exc, (rexc.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, (rexc.ConnectionError, OSError, rexc.ClusterDownError, rexc.AskError,
                        rexc.TryAgainError, rexc.ReadOnlyError, rexc.RedisClusterException)):
        return "unavailable"
    return "error"


def no_retry_options(connect_timeout: float, socket_timeout: float) -> dict[str, Any]:
    return {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout,
            "retry": Retry(NoBackoff(), 0), "health_check_interval": 0}


class RedisNode:
    """One server: a client made on first use (inside the running loop), and the backoff
    after a failure."""

    def __init__(self, name: str, make_client: Callable[[], Redis], backoff: float):
        self.name, self._make, self.backoff = name, make_client, backoff
        self._client: Redis | None = None
        self._down_until = float("-inf")

    def mark_down(self) -> None:
        self._down_until = asyncio.get_running_loop().time() + self.backoff

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """One pipelined round trip; replies in order, a command's error in its place.
        Raises when the round trip itself fails."""
        if asyncio.get_running_loop().time() < self._down_until:
            raise NodeDown(f"{self.name} failed less than {self.backoff}s ago")
        reused = self._client is not None
        for attempt in range(2):
            if self._client is None:
                self._client = self._make()
            pipe = self._client.pipeline(transaction=False)
            for cmd in commands:
                pipe.execute_command(*cmd)
            try:
                return await pipe.execute(raise_on_error=False)
            except rexc.ConnectionError:
                # A pooled connection to a server that restarted fails once: drop the client
                # and try again at once on a new one, before calling the server down.
                await self.aclose()
                if attempt == 0 and reused:
                    continue
                self.mark_down()
                raise
            except Exception as e:
                if cause_of(e) in ("unavailable", "timeout"):
                    self.mark_down()
                raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


# EXISTS of each key, one reply per key (EXISTS k1 k2 ... only counts them).
_EXISTS_EACH = ("local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('EXISTS', k) "
                "end return r")


class RoutedRedisStore(KVStorage):
    """get/put/exists/touch/delete over nodes that `_plan` routes keys to."""

    def __init__(self, *, backoff: float):
        self.backoff = backoff
        self.stats = StorageStats()
        self._loop: asyncio.AbstractEventLoop | None = None

    @abstractmethod
    async def _plan(self, keys: Sequence[str], deadline: float
                    ) -> tuple[Plan, dict[int, BaseException]]:
        """The nodes serving `keys`, and why each key that has no node has none."""

    def _node_failed(self, node: RedisNode, exc: BaseException) -> None:
        """Hook: a node's round trip failed (the cluster refreshes its topology)."""

    # ---- the KVStorage methods ----------------------------------------------------------
    async def get(self, keys: Sequence[str], timeout: float) -> list[Payload | None]:
        deadline = self._deadline(timeout)
        values: list[Payload | None] = [None] * len(keys)
        causes: list[str | None] = [None] * len(keys)
        corrupt: list[str] = []
        pairs = await self._send(keys, deadline, lambda g: ("MGET", *[keys[i] for i in g]), False)
        for idx, reply in pairs:
            if isinstance(reply, BaseException):
                for i in idx:
                    causes[i] = cause_of(reply)
                continue
            for i, blob in zip(idx, reply):
                if blob is None:
                    continue
                try:
                    values[i] = entry.decode(keys[i], blob)     # a view: no copy
                except entry.CorruptEntry as e:
                    causes[i] = "corrupt"
                    if e.delete:
                        corrupt.append(keys[i])
        self._count_get(values, causes)
        if corrupt and self._remaining(deadline) > 0:
            pairs = await self._send(corrupt, deadline,
                                     lambda g: ("DEL", *[corrupt[i] for i in g]), False)
            for _, reply in pairs:
                if isinstance(reply, int):
                    self.stats.deleted_corrupt += reply
        return values

    async def put(self, items: Sequence[tuple[str, bytes]], timeout: float) -> list[bool]:
        deadline = self._deadline(timeout)
        keys = [k for k, _ in items]
        blobs = [entry.encode(k, v) for k, v in items]
        ok = [False] * len(items)
        causes: list[str | None] = [None] * len(items)
        pairs = await self._send(keys, deadline, lambda g: ("SET", keys[g[0]], blobs[g[0]]), True)
        for idx, reply in pairs:
            if isinstance(reply, BaseException):
                causes[idx[0]] = cause_of(reply)
            else:
                ok[idx[0]] = True
        self._count_put(items, ok, causes)
        return ok

    async def exists(self, keys: Sequence[str], timeout: float) -> list[bool]:
        # One command per key group (as MGET): a script answers every key of the group, so
        # a lookup of a long prompt's pages costs one command, not one per page.
        found = [False] * len(keys)
        causes: list[str | None] = [None] * len(keys)
        pairs = await self._send(keys, self._deadline(timeout),
                                 lambda g: ("EVAL", _EXISTS_EACH, len(g), *[keys[i] for i in g]),
                                 False)
        for idx, reply in pairs:
            if isinstance(reply, BaseException):
                for i in idx:
                    causes[i] = cause_of(reply)
            else:
                for i, r in zip(idx, reply):
                    found[i] = bool(r)
        self._count_errors(causes)
        return found

    async def touch(self, keys: Sequence[str], timeout: float) -> None:
        self.stats.touches += len(keys)
        await self._simple(keys, timeout, "TOUCH")

    async def delete(self, keys: Sequence[str], timeout: float) -> None:
        await self._simple(keys, timeout, "DEL")

    async def _simple(self, keys: Sequence[str], timeout: float, name: str) -> None:
        pairs = await self._send(keys, self._deadline(timeout),
                                 lambda g: (name, *[keys[i] for i in g]), False)
        for idx, reply in pairs:
            if isinstance(reply, BaseException):
                self._count_errors([cause_of(reply)] * len(idx))

    def check_integrity(self) -> None:
        """Nothing to check: Redis keeps its own accounting, and entries are checked on read."""

    # ---- fan-out ------------------------------------------------------------------------
    def _deadline(self, timeout: float) -> float:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError(f"{self.describe()} is bound to another event loop")
        return loop.time() + timeout

    @staticmethod
    def _remaining(deadline: float) -> float:
        return max(deadline - asyncio.get_running_loop().time(), 0.0)

    async def _send(self, keys: Sequence[str], deadline: float,
                    command: Callable[[list[int]], Command], per_key: bool
                    ) -> list[tuple[list[int], Any]]:
        """One command per key group (per key with `per_key`), built by `command` from the
        group's key indices; each node's commands in one pipeline, all nodes concurrently,
        until the deadline. Returns (key indices, reply) pairs covering every key; a failure
        is an exception in place of the reply."""
        if not keys:
            return []
        try:
            plan, unrouted = await asyncio.wait_for(self._plan(keys, deadline),
                                                    self._remaining(deadline))
        except asyncio.TimeoutError as e:
            return [(list(range(len(keys))), e)]
        out: list[tuple[list[int], Any]] = [([i], e) for i, e in unrouted.items()]
        jobs: list[tuple[RedisNode, list[list[int]]]] = []
        for node, groups in plan:
            jobs.append((node, [[i] for g in groups for i in g] if per_key else groups))
        tasks = [asyncio.ensure_future(node.execute([command(g) for g in gs])) for node, gs in jobs]
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=self._remaining(deadline))
        finally:
            late = [t for t in tasks if not t.done()]
            for t in late:
                t.cancel()
        for (node, groups), task in zip(jobs, tasks):
            replies: Sequence[Any]
            if task in late:
                node.mark_down()    # it did not answer a whole batch: a hung server
                replies = [asyncio.TimeoutError(f"{node.name}: past the deadline")] * len(groups)
            elif task.exception() is not None:
                exc = task.exception()
                assert exc is not None
                self._node_failed(node, exc)
                replies = [exc] * len(groups)
            else:
                replies = task.result()
                for r in replies:
                    if isinstance(r, (rexc.AskError, rexc.ClusterDownError, rexc.TryAgainError)):
                        self._node_failed(node, r)
                        break
            out.extend(zip(groups, replies))
        if late:    # let the cancelled round trips drop their connections before we return
            await asyncio.wait(late)
        return out


class RedisStore(RoutedRedisStore):
    scheme = "redis"

    def __init__(self, url: str, *, connect_timeout: float = 0.5, socket_timeout: float = 2.0,
                 backoff: float = 0.5):
        super().__init__(backoff=backoff)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"not a Redis URL: {url!r} (redis://HOST:PORT[/DB])")
        self.url = url
        self._where = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        opts = no_retry_options(connect_timeout, socket_timeout)
        self.node = RedisNode(self._where, lambda: Redis.from_url(url, **opts), backoff)

    def describe(self) -> str:
        return self._where

    async def _plan(self, keys: Sequence[str], deadline: float
                    ) -> tuple[Plan, dict[int, BaseException]]:
        return [(self.node, [list(range(len(keys)))])], {}

    async def aclose(self) -> None:
        await self.node.aclose()
        self._loop = None
