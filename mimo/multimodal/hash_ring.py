"""ConsistentHashRing: route media hashes to encoder workers so the same media always
reaches the same worker (and its embedding cache), and a worker joining or leaving moves
only about 1/N of the keys.

Each worker owns `replicas` points on a 64-bit ring (virtual nodes smooth the load); a key
belongs to the first point clockwise from its own hash.
"""
from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable


def ring_hash(text: str) -> int:
    """A stable 64-bit position (not Python's hash(), which is salted per process: every
    router replica must place keys identically)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHashRing:
    def __init__(self, workers: Iterable[str] = (), replicas: int = 160):
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.replicas = replicas
        self._points: list[int] = []      # sorted ring positions
        self._owner: dict[int, str] = {}  # position -> worker
        self._workers: set[str] = set()
        for w in workers:
            self.add(w)

    @property
    def workers(self) -> frozenset[str]:
        return frozenset(self._workers)

    def _positions(self, worker: str) -> list[int]:
        return [ring_hash(f"{worker}#{i}") for i in range(self.replicas)]

    def add(self, worker: str) -> None:
        if worker in self._workers:
            return
        self._workers.add(worker)
        for p in self._positions(worker):
            # A 64-bit collision between workers is astronomically rare; the first owner
            # keeps the point so routing stays a function of the worker set alone.
            if p not in self._owner:
                self._owner[p] = worker
                bisect.insort(self._points, p)

    def remove(self, worker: str) -> None:
        if worker not in self._workers:
            return
        self._workers.discard(worker)
        for p in self._positions(worker):
            if self._owner.get(p) == worker:
                del self._owner[p]
                self._points.pop(bisect.bisect_left(self._points, p))
        # Reclaim points a removed worker had shadowed (collision case above).
        for w in self._workers:
            for p in self._positions(w):
                if p not in self._owner:
                    self._owner[p] = w
                    bisect.insort(self._points, p)

    def route(self, key: str) -> str:
        """The worker for `key` (e.g. a media sha256)."""
        if not self._points:
            raise LookupError("the hash ring has no workers")
        i = bisect.bisect_right(self._points, ring_hash(key))
        return self._owner[self._points[i % len(self._points)]]
