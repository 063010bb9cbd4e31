"""Slot addressing: positions -> slots through a page table, and the full -> SWA slot map.

`SlotMap.table[full_slot]` is the SWA slot holding the same token's SWA-layer KV, or -1 (no
SWA KV: never written, or released). The rest of the system addresses a sequence by full
slots; SWA layers translate through this map. `DualPool` keeps it in step with the page
tables; it exists only for pools with storage (bookkeeping-only pools have no slots to map).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch


def page_slots(pages: Sequence[int | None], start: int, end: int, page_size: int,
               what: str = "KV") -> torch.Tensor:
    """Slots of positions [start, end) through `pages` (logical page -> physical page);
    every page they touch must be present (None: released)."""
    # A handful of numpy ops on the pages in range: this runs for every row of a step, on
    # caches the weights' stream has just emptied (each op costs microseconds there).
    if start >= end:
        return torch.empty(0, dtype=torch.int64)
    p0, p1 = start // page_size, (end - 1) // page_size + 1
    touched = pages[p0:p1]
    if len(touched) < p1 - p0:
        raise RuntimeError(f"{what} for positions [{start}, {end}) has no page yet")
    if None in touched:
        raise RuntimeError(f"{what} for positions [{start}, {end}) was already released")
    slots = np.add.outer(np.array(touched, dtype=np.int64) * page_size, _offsets(page_size))
    a = start - p0 * page_size
    return torch.from_numpy(slots.reshape(-1)[a:a + end - start])


@functools.cache
def _offsets(page_size: int) -> np.ndarray:
    return np.arange(page_size, dtype=np.int64)


class SlotMap:
    def __init__(self, full_pages: int, page_size: int):
        self.page_size = page_size
        self.table = torch.full((full_pages * page_size,), -1, dtype=torch.int64)
        self._offsets = torch.arange(page_size)

    def map(self, full_page: int, swa_page: int) -> None:
        """`swa_page` holds the SWA KV of `full_page`'s tokens."""
        P = self.page_size
        self.table[full_page * P:(full_page + 1) * P] = swa_page * P + self._offsets

    def unmap(self, full_page: int) -> None:
        P = self.page_size
        self.table[full_page * P:(full_page + 1) * P] = -1

    def unmap_if(self, full_page: int, swa_page: int) -> None:
        """Unmap `full_page` if it still maps to `swa_page` (a cached full page may have
        been re-paired with the cache's own SWA page meanwhile)."""
        P = self.page_size
        if int(self.table[full_page * P]) == swa_page * P:
            self.table[full_page * P:(full_page + 1) * P] = -1

    def mapped_slots(self) -> int:
        return int((self.table >= 0).sum())

    def distinct_targets(self) -> int:
        """SWA slots some full slot maps to (a cached SWA page may be mapped twice)."""
        return int(torch.unique(self.table[self.table >= 0]).numel())
