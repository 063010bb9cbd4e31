"""Where a tiered hit may end: the longest prefix whose pages are present in some tier.

The L1 rule, unchanged: a hit of n pages needs full KV for pages [0, n) and SWA KV for the
window before n * P (`window_pages`). Each page may come from a different tier (full KV in
L1, its window in L2: a split hit); this only asks whether some tier has it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..radix.retention import window_pages


def best_hit(full_ok: Sequence[bool], swa_ok: Sequence[bool] | None, window: int,
             page_size: int, floor: int = 0) -> int:
    """Largest n > floor (pages) with every full page below n present and, unless `swa_ok`
    is None (no SWA pool: every layer is full), every SWA page of the window before n * P
    present; `floor` if there is none."""
    n = 0
    while n < len(full_ok) and full_ok[n]:
        n += 1
    if swa_ok is None:
        return max(n, floor)
    while n > floor:
        if all(swa_ok[i] for i in window_pages(n * page_size, window, page_size)):
            return n
        n -= 1
    return floor


def window_of(n: int, window: int, page_size: int) -> range:
    """SWA pages a hit of n pages needs."""
    return window_pages(n * page_size, window, page_size)
