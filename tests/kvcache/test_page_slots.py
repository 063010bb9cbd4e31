"""`page_slots` (positions -> cache slots through a page table) against a position-by-position
walk of the table, on random tables with released pages, every page size the pools use and
ranges that run past the table or start on a released page."""
from __future__ import annotations

import random

import pytest

from mimo.kvcache.pool.slot_map import page_slots


def _walk(pages, start, end, P):
    if start < end and (end - 1) // P >= len(pages):
        raise IndexError                # positions with no page yet
    out = []
    for p in range(start, end):
        page = pages[p // P]
        if page is None:
            raise LookupError
        out.append(page * P + p % P)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_walk_of_the_table(seed):
    r = random.Random(seed)
    checked = {"ok": 0, "released": 0, "no page": 0}
    for _ in range(1500):
        P = r.choice([1, 2, 16, 64])
        n = r.randint(0, 24)
        pages: list[int | None] = r.sample(range(200), n)
        for i in range(r.randint(0, n)):      # a window release frees the oldest pages
            pages[i] = None
        start = r.randint(0, n * P + 1)
        end = r.randint(start, n * P + 3)
        try:
            want = _walk(pages, start, end, P)
        except IndexError:
            with pytest.raises(RuntimeError, match="no page yet"):
                page_slots(pages, start, end, P)
            checked["no page"] += 1
            continue
        except LookupError:
            with pytest.raises(RuntimeError, match="already released"):
                page_slots(pages, start, end, P, "SWA KV")
            checked["released"] += 1
            continue
        got = page_slots(pages, start, end, P)
        assert got.tolist() == want
        checked["ok"] += 1
    assert min(checked.values()) > 50, checked
