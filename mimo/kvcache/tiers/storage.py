"""L3 storage: the backend interface, its counters, and `open_storage(url)` (by scheme).

Backends: a local directory (`file:DIR`), one Redis (`redis://HOST:PORT[/DB]`, `rediss://`
for TLS, a password as `redis://:PASSWORD@HOST:PORT`), a Redis Cluster
(`redis-cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]`, no TLS form yet). Each stores opaque
byte values under str keys, wrapped in a checked header (entry.py), and answers every fault
as a miss or a dropped write.

Redis settings for a KV cache:
- `maxmemory`: the bytes of KV you want to keep, plus Redis's overhead: about 1 MB of its
  own, and the allocator's rounding of each value, which is small for most sizes but a
  quarter for a value just over a power of two (a page of exactly 1 MiB plus its 48-byte
  header occupies 1.25 MiB; `MEMORY USAGE key` shows it). Without `maxmemory` Redis grows
  until the machine swaps or the OOM killer ends it.
- `maxmemory-policy allkeys-lru`: Redis then evicts the least recently used entries, and the
  engine's keep-alive touches (TOUCH on the L3 keys of prefixes hit in L1/L2) decide what
  stays. With `noeviction` a full Redis refuses writes (counted as dropped, cause "full") and
  keeps its old entries forever. Redis's LRU clock ticks once a second and samples keys
  (`maxmemory-samples 10` makes it closer to true LRU at little cost).
- Persistence: for a pure cache, off (`save ""`, `appendonly no`): nothing is written to disk
  and a restart starts empty. Turn it on (RDB `save 300 1` or `appendonly yes`) if the cache
  should survive a Redis restart; entries are checked on every read either way.
- Redis Cluster: `cluster-require-full-coverage no`, so that when one master dies the others
  keep serving their slots (with the default `yes` the whole cluster refuses every key once the
  failure is detected, and every lookup misses until the master is back).
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# A stored value as a backend returns it: bytes, or a view into the reply it came in (no copy).
Payload = bytes | memoryview

CAUSES = ("timeout", "unavailable", "corrupt", "full", "error")   # miss / drop causes


def _zero_causes() -> dict[str, int]:
    return {c: 0 for c in CAUSES}


@dataclass
class StorageStats:
    """Running totals. The I/O thread writes them, /metrics reads them from another thread:
    plain ints, each written by one thread only, so no lock is needed."""
    gets: int = 0           # keys asked for
    hits: int = 0
    misses: int = 0         # absent entries plus failed ones (those also count in `errors`)
    puts: int = 0           # keys offered
    stored: int = 0
    dropped: int = 0        # writes that failed or were refused (cap, full, down, deadline)
    bytes_read: int = 0     # payload bytes returned by hits (headers excluded)
    bytes_written: int = 0  # payload bytes stored
    touches: int = 0
    deleted_corrupt: int = 0
    # per key, by cause: failed gets and puts, and the keys of failed exists/touch/delete
    errors: dict[str, int] = field(default_factory=_zero_causes)


class StorageIntegrityError(AssertionError):
    """A backend's bookkeeping disagrees with what it stores (check_integrity)."""


class KVStorage(ABC):
    """L3 backend: opaque str keys -> bytes values, shared across processes. Every method is a
    coroutine run on ONE asyncio loop (the tier's I/O thread); a client is created lazily on first
    use inside that loop. Never raises for I/O problems: a failed get is a miss (None), a failed
    put is a dropped write (False), both counted by cause in `stats.errors`. Programming errors
    (bad arguments) may raise.

    `timeout` is the deadline of the whole batch, in seconds: keys not answered by then are
    misses (or dropped writes) counted as "timeout". The methods are safe to cancel."""

    scheme: str
    stats: StorageStats

    @abstractmethod
    async def get(self, keys: Sequence[str], timeout: float) -> list[Payload | None]: ...

    @abstractmethod
    async def put(self, items: Sequence[tuple[str, bytes]], timeout: float) -> list[bool]: ...

    @abstractmethod
    async def exists(self, keys: Sequence[str], timeout: float) -> list[bool]: ...

    async def get_and_probe(self, get_keys: Sequence[str], probe_keys: Sequence[str],
                            timeout: float) -> tuple[list[Payload | None], list[bool]]:
        """`get(get_keys)` and `exists(probe_keys)` at once, so that a lookup which reads the
        pages it expects and asks only whether the others exist costs one round trip."""
        got, found = await asyncio.gather(self.get(get_keys, timeout),
                                          self.exists(probe_keys, timeout))
        return got, found

    @abstractmethod
    async def touch(self, keys: Sequence[str], timeout: float) -> None:
        """Refresh the entries' LRU age (keep-alive); absent keys are ignored."""

    @abstractmethod
    async def delete(self, keys: Sequence[str], timeout: float) -> None: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Cheap self-check of the backend's own bookkeeping; raises StorageIntegrityError."""

    @abstractmethod
    def describe(self) -> str:
        """Where the entries live, e.g. "redis://127.0.0.1:6379/0" (never a password)."""

    # ---- counting, shared by the backends (called on the I/O loop only) ----------------
    def _count_errors(self, causes: Sequence[str | None]) -> None:
        for c in causes:
            if c is not None:
                self.stats.errors[c] += 1

    def _count_get(self, values: Sequence[Payload | None], causes: Sequence[str | None]) -> None:
        s = self.stats
        s.gets += len(values)
        for v in values:
            if v is None:
                s.misses += 1
            else:
                s.hits += 1
                s.bytes_read += len(v)
        self._count_errors(causes)

    def _count_put(self, items: Sequence[tuple[str, bytes]], ok: Sequence[bool],
                   causes: Sequence[str | None]) -> None:
        s = self.stats
        s.puts += len(items)
        for (_, payload), good in zip(items, ok):
            if good:
                s.stored += 1
                s.bytes_written += len(payload)
            else:
                s.dropped += 1
        self._count_errors(causes)


class StoreFactory(Protocol):
    """Makes the backend a URL of one scheme names. `disk_cap` (bytes, None = no cap) and
    `min_age` (seconds an entry is safe from eviction after its last use) are the file
    store's; a backend without such settings ignores them (Redis has `maxmemory`).
    `timeout`: the tier's deadline for a batch, which a network client's connect and socket
    timeouts are set to: the deadline alone decides when a call has failed (a 0.5 s connect
    timeout failed a whole batch whose loop noticed the connection late, the deadline not
    yet spent)."""

    def __call__(self, url: str, *, disk_cap: int | None, min_age: float,
                 timeout: float) -> KVStorage: ...


@dataclass(frozen=True)
class StoreScheme:
    factory: StoreFactory
    usage: str                  # the URL's form, for errors and --help
    slashes: bool = True        # written scheme://...; False: scheme:REST too (file:DIR)


def _file_store(url: str, *, disk_cap: int | None, min_age: float,
                timeout: float) -> KVStorage:
    from .file_store import FileStore
    path = url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
    if not path:
        raise ValueError(f"KV storage URL {url!r} names no directory")
    return FileStore(path, disk_cap=disk_cap, min_age=min_age)


def _redis_store(url: str, *, disk_cap: int | None, min_age: float,
                 timeout: float) -> KVStorage:
    from .redis_store import RedisStore
    return RedisStore(url, connect_timeout=timeout, socket_timeout=timeout)


def _redis_cluster_store(url: str, *, disk_cap: int | None, min_age: float,
                         timeout: float) -> KVStorage:
    from .redis_cluster_store import RedisClusterStore
    return RedisClusterStore(url, connect_timeout=timeout, socket_timeout=timeout)


# The backends by URL scheme (the backends' modules load on first use: Redis's client is
# imported only where a Redis store is asked for).
STORES: dict[str, StoreScheme] = {
    "file": StoreScheme(_file_store, "file:DIR (or file://DIR)", slashes=False),
    "redis": StoreScheme(_redis_store, "redis://HOST:PORT[/DB] (rediss:// for TLS)"),
    "rediss": StoreScheme(_redis_store, "rediss://HOST:PORT[/DB]"),
    "redis-cluster": StoreScheme(_redis_cluster_store, "redis-cluster://HOST:PORT[,HOST:PORT...]"),
}
ACCEPTED = tuple(s.usage for name, s in STORES.items() if name != "rediss")


def open_storage(url: str, *, disk_cap: int | None = None, min_age: float = 1.0,
                 timeout: float = 2.0) -> KVStorage:
    """The backend named by `url`, chosen by its scheme (`STORES`). Nothing is connected or
    read here: that happens on first use. `timeout`: the tier's deadline (StoreFactory)."""
    scheme, colon, rest = url.partition(":")
    entry = STORES.get(scheme) if colon else None
    if entry is None or (entry.slashes and not rest.startswith("//")):
        raise ValueError(f"unknown KV storage URL {url!r}: known schemes "
                         f"{', '.join(STORES)}; accepted: {', '.join(ACCEPTED)}")
    return entry.factory(url, disk_cap=disk_cap, min_age=min_age, timeout=timeout)
