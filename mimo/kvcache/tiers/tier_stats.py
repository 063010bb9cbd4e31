"""Counters of the lower tiers, per tier, for /metrics (plain integers, engine thread)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class TierCounters:
    hit_tokens: int = 0       # prompt tokens whose full KV this tier supplied
    miss_tokens: int = 0      # admitted prompt tokens no tier served (counted in each tier)
    bytes_read: int = 0       # KV bytes loaded from this tier into L1
    bytes_written: int = 0    # KV bytes stored into this tier
    pages_read: dict[str, int] = field(default_factory=lambda: {"f": 0, "s": 0})
    pages_written: dict[str, int] = field(default_factory=lambda: {"f": 0, "s": 0})
