"""The prefill planner: how many prompt tokens a prefilling request computes this step.

The scheduler asks it once per prefilling request, in order, with what is left of the step's
token budget and how many tokens the pools can take right now; it never allocates or touches
the queue itself, so a different chunking policy swaps in without touching prefix matching
or decoding (`EngineParts(prefill=...)`).

Invariant the scheduler relies on (and checks): 0 <= plan(...) <= min(remaining, budget,
room); 0 means "not this step".
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Sequence


class PrefillPlanner(ABC):
    @abstractmethod
    def plan(self, seq: Sequence, remaining: int, budget: int, room: int) -> int:
        """`remaining`: prompt tokens still to compute; `budget`: tokens left in this step;
        `room`: tokens the free (and cache-evictable) pages can hold for this request."""


class ChunkedPrefill(PrefillPlanner):
    """Chunked prefill: as much as the budget and the pools allow (the default)."""

    def plan(self, seq: Sequence, remaining: int, budget: int, room: int) -> int:
        return max(0, min(remaining, budget, room))
