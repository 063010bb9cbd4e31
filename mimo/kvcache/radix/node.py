"""Nodes of the SWA-aware radix tree, what a match and an insert return, and the tombstones
and time handicaps its pages and LRU orders use.

See `tree.py` for the rules. Positions are token positions from the root; logical
page g covers positions [g * P, (g + 1) * P); a node covers pages [start / P, end / P).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

NO_SWA = -1            # tombstone: this page's SWA KV was never kept (outside every window)
EVICTED_SWA = -2       # tombstone: it was kept, then freed by SWA-only eviction
SPECULATIVE = 1 << 40   # SWA-time handicap: dense-grid windows, superseded cached ends
# A session's head start in both LRU orders: younger than any keyless use for 2**38 ticks (a
# tick per match or insert), and less than SPECULATIVE, so a session's speculative windows
# still go before keyless firm ones. A session paused in a tool call: PAUSED (hold.py).
PROTECTED = 1 << 38
PAUSED = 1 << 39


class Node:
    __slots__ = ("parent", "children", "tokens", "full", "swa", "swa_lock", "start",
                 "lock_ref", "time", "swa_time", "alive", "keys")

    def __init__(self, parent: Node | None, tokens: array[int], full: list[int],
                 swa: list[int] | None, start: int, now: int) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.tokens = tokens                 # len == len(full) * page_size
        self.full: list[int] = full
        self.swa: list[int] | None = swa     # < 0: tombstone; None in full-kv mode
        self.swa_lock: dict[int, int] = {}   # local page index -> lockers needing it
        self.start = start                   # token position of tokens[0]
        self.lock_ref = 0                    # lockers whose path includes this node
        self.time = now                      # node LRU: last use as (part of) a prefix
        self.swa_time = now                  # SWA LRU: last match ending here, or write
        self.alive = True
        # The tiers' page keys of this node's pages (tiers/keys.py), filled in when a tier
        # first needs them. A key names the whole prefix up to its page, which never
        # changes for a node's pages (a split hands the first ones to the new prefix node).
        self.keys: list[bytes] | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class MatchResult:
    length: int                 # window-safe reusable tokens (page multiple)
    prefix_len: int             # tokens equal to a cached path (>= length): the branch point
    node: Node | None           # node ending at `length` (a root when length == 0)
    full_pages: list[int] = field(default_factory=list)           # one per page of `length`
    swa_pages: list[int | None] = field(default_factory=list)     # None outside the window
    swa_first: int = 0          # first logical page with SWA in swa_pages (window start)
    # Tokens whose full KV the match hands over (full_pages covers them). Equal to `length`
    # unless the match is a window rebuild: then the full KV runs on to `full_len` and the
    # request recomputes [length, full_len) only for its SWA layers (`RadixTree.match`).
    full_len: int = 0
    swa_exact_from: int = 0     # first position whose SWA KV the request computes exactly

    @property
    def rebuild(self) -> bool:
        return self.full_len > self.length


@dataclass
class InsertResult:
    dup_full: list[int]         # caller's full pages the tree did not take: caller frees
    dup_swa: list[int]          # caller's SWA pages the tree did not take: caller frees
    remap: list[tuple[int, int]]  # (tree full page, caller SWA page) revived: fix full->SWA map
    cached_len: int             # tokens of the sequence now in the tree
