"""Page allocator: bookkeeping only, no tensors.

Every page is in exactly one state: FREE (on the free list), IN_USE (held by a running
request) or EVICTABLE (held by the prefix cache, reclaimable). The invariant
`free + evictable + in_use == capacity` is what `check_integrity()` asserts; freeing a page
that is not in use raises, so a double free is caught where it happens.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

FREE, IN_USE, EVICTABLE = 0, 1, 2


class OutOfPages(RuntimeError):
    """The pool has fewer free pages than asked for."""


class DoubleFree(RuntimeError):
    """A page was freed (or parked) that is not held."""


class PageAllocator:
    def __init__(self, num_pages: int, name: str = "pool"):
        if num_pages < 0:
            raise ValueError("num_pages must be >= 0")
        self.name = name
        self.capacity = num_pages
        # LIFO free list: recently freed pages are reused first (warm in cache).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._state = np.zeros(num_pages, dtype=np.int8)
        self._evictable = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_evictable(self) -> int:
        return self._evictable

    @property
    def num_in_use(self) -> int:
        return self.capacity - len(self._free) - self._evictable

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"{self.name}: asked for {n} pages, {len(self._free)} free")
        if n <= 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        self._state[pages] = IN_USE
        return pages

    def _check_ids(self, pages: list[int]) -> None:
        # numpy would wrap a negative id onto the last page and alias two ids to one page.
        if any(not 0 <= p < self.capacity for p in pages):
            raise ValueError(f"{self.name}: page id out of range in {pages[:8]}")

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        if not pages:
            return
        self._check_ids(pages)
        st = self._state[pages]
        if (st != IN_USE).any() or len(set(pages)) != len(pages):
            bad = [p for p, s in zip(pages, st) if s != IN_USE]
            raise DoubleFree(f"{self.name}: freeing pages not in use: {bad[:8]}")
        self._state[pages] = FREE
        self._free.extend(pages)

    def park(self, pages: Iterable[int]) -> None:
        """IN_USE -> EVICTABLE: the prefix cache keeps the pages but may reclaim them."""
        pages = list(pages)
        self._check_ids(pages)
        if (self._state[pages] != IN_USE).any() or len(set(pages)) != len(pages):
            raise DoubleFree(f"{self.name}: parking pages not in use")
        self._state[pages] = EVICTABLE
        self._evictable += len(pages)

    def unpark(self, pages: Iterable[int]) -> None:
        """EVICTABLE -> IN_USE (a cache hit re-locks them)."""
        pages = list(pages)
        self._check_ids(pages)
        if (self._state[pages] != EVICTABLE).any() or len(set(pages)) != len(pages):
            raise DoubleFree(f"{self.name}: unparking pages not evictable")
        self._state[pages] = IN_USE
        self._evictable -= len(pages)

    def check_integrity(self) -> None:
        n_free = int((self._state == FREE).sum())
        n_evict = int((self._state == EVICTABLE).sum())
        n_use = int((self._state == IN_USE).sum())
        assert n_free == len(self._free), f"{self.name}: free list {len(self._free)} != {n_free} free pages"
        assert len(set(self._free)) == len(self._free), f"{self.name}: duplicate page on free list"
        assert n_evict == self._evictable, f"{self.name}: evictable count drifted"
        assert n_free + n_evict + n_use == self.capacity, f"{self.name}: accounting broken"
        assert self.num_free + self.num_evictable + self.num_in_use == self.capacity

    def stats(self) -> dict[str, int]:
        return {"capacity": self.capacity, "free": self.num_free,
                "evictable": self.num_evictable, "in_use": self.num_in_use}
