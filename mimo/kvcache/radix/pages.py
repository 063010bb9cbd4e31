"""Which pages the radix tree holds. A page the tree takes is parked (EVICTABLE) in its
allocator and marked owned; freeing one unmarks it and frees it through unpark + free, so the
allocator sees EVICTABLE -> IN_USE -> FREE and raises on any page freed twice. A page passed
to an insert is handed back exactly when the tree does not hold it afterwards, whatever the
caller's tokens cover."""
from __future__ import annotations

import numpy as np

from ..pool.allocator import PageAllocator


class PageBook:
    def __init__(self, full_alloc: PageAllocator, swa_alloc: PageAllocator | None) -> None:
        self.full_alloc, self.swa_alloc = full_alloc, swa_alloc
        self.own_f = np.zeros(full_alloc.capacity, dtype=bool)
        self.own_s = np.zeros(0 if swa_alloc is None else swa_alloc.capacity, dtype=bool)
        # Owned SWA pages kept only as spare (retention's `spare`: no checkpoint's window):
        # the tiers never copy them down.
        self.spare_s = np.zeros_like(self.own_s)

    @property
    def swa_pool(self) -> PageAllocator:
        """The SWA allocator: every tree in hybrid mode has one, and only hybrid mode
        touches SWA pages."""
        assert self.swa_alloc is not None, "SWA pages outside hybrid mode"
        return self.swa_alloc

    def take_full(self, pages: list[int]) -> None:
        self.full_alloc.park(pages)
        self.own_f[pages] = True

    def take_swa(self, pages: list[int]) -> None:
        self.swa_pool.park(pages)
        self.own_s[pages] = True

    def free_full(self, pages: list[int]) -> None:
        self.own_f[pages] = False
        self.full_alloc.unpark(pages)
        self.full_alloc.free(pages)

    def mark_spare(self, pages: list[int], spare: bool = True) -> None:
        self.spare_s[pages] = spare

    def is_spare(self, page: int) -> bool:
        return bool(self.spare_s[page])

    def free_swa(self, pages: list[int]) -> None:
        self.own_s[pages] = False
        self.spare_s[pages] = False
        self.swa_pool.unpark(pages)
        self.swa_pool.free(pages)

    def hand_over(self, full: int, swa: int | None) -> None:
        """A page (and its SWA page) leaves the tree for a request, unfreed: IN_USE, not
        owned, so the request's `DualPool.free_seq` frees it later."""
        self.own_f[full] = False
        self.full_alloc.unpark([full])
        if swa is not None:
            self.own_s[swa] = False
            self.spare_s[swa] = False
            self.swa_pool.unpark([swa])

    def owns_full(self, page: int) -> bool:
        return bool(self.own_f[page])

    def owns_swa(self, page: int) -> bool:
        return bool(self.own_s[page])

    def not_held_full(self, pages: list[int]) -> list[int]:
        """Of the full pages a caller passed, those the tree does not hold (the caller
        frees them)."""
        return [p for p, o in zip(pages, self.own_f[list(pages)]) if not o]

    def not_held_swa(self, pages: list[int]) -> list[int]:
        return [s for s, o in zip(pages, self.own_s[list(pages)]) if not o]
