"""Prompt-lookup drafting: if the last n tokens occurred before, propose what followed them.

Works with any model (no weights): it pays off where the output copies its input (quoting,
editing code, extraction). n runs from `max_n` down to `min_n`; the most recent earlier
occurrence wins (nearest context is the likeliest to be copied).

Each request keeps an index {n-gram: end position of its latest occurrence}, updated
incrementally with the tokens that arrived since the last call, so a proposal costs
O(max_n - min_n + k) whatever the length. The index lags one token behind the sequence: the
current suffix must match an *earlier* occurrence, one with a continuation.
"""
from __future__ import annotations

import weakref

from .drafter import Drafter


class _Index:
    __slots__ = ("ends", "upto")

    def __init__(self):
        self.ends: dict[tuple[int, ...], int] = {}
        self.upto = 0          # continuations at positions <= upto are indexed


class NgramDrafter(Drafter):
    def __init__(self, max_n: int = 4, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n
        # Weak keys: an index dies with its request even if on_finished was never called.
        self._index: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def propose(self, seqs: list, k: int) -> list[list[int]]:
        return [self.propose_one(s.all_ids, self._index.setdefault(s, _Index()), k) for s in seqs]

    def propose_one(self, toks: list[int], idx: _Index, k: int) -> list[int]:
        L = len(toks)
        ends = idx.ends
        # Index every n-gram ending at positions (idx.upto, L - 1]: all but the suffix itself.
        for e in range(idx.upto + 1, L):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                ends[tuple(toks[e - n:e])] = e
        idx.upto = max(idx.upto, L - 1)
        if k <= 0:
            return []
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            e = ends.get(tuple(toks[L - n:]))
            if e is None:
                continue
            # What followed the match; past the end of the sequence the copy continues with
            # its own proposal (a period-(L - e) repetition), so short periods still give k.
            out: list[int] = []
            for j in range(k):
                i = e + j
                out.append(toks[i] if i < L else out[i - L])
            return out
        return []

    def on_finished(self, seq) -> None:
        self._index.pop(seq, None)
