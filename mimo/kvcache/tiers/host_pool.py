"""HostPool: the host-memory KV tier (L2), one row store per kind of KV.

Pages L1 evicts come down here (write-back: whole nodes and SWA-only evictions alike) and
go back up when a later request's hit reaches them. Each kind (full, SWA) has its own rows
[capacity, row_elems] and its own `PageAllocator`, so the accounting is the pools' own:
FREE (no data), EVICTABLE (holds a page's KV under its key, LRU order) and IN_USE (pinned:
a load is reading it, so neither eviction nor a new write may take it). The byte budget is
split between the kinds in proportion to L1's pools, the same balance of full and SWA KV.
On CUDA the rows are pinned memory so copies to the device can run asynchronously.

Ownership: only the engine thread touches a HostPool.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from ..pool.allocator import EVICTABLE, IN_USE, PageAllocator


class HostStore:
    """One kind's rows, keyed by page key, LRU-evicted."""

    def __init__(self, name: str, capacity: int, row_elems: int, dtype: torch.dtype,
                 pin: bool = False):
        self.name = name
        self.alloc = PageAllocator(capacity, name)
        self.rows = torch.empty(capacity, row_elems, dtype=dtype, pin_memory=pin)
        self.index: OrderedDict[bytes, int] = OrderedDict()   # key -> slot, oldest first
        self._key_of: dict[int, bytes] = {}
        self._pins: dict[int, int] = {}
        self.evicted = 0
        # Told (key, present) after a key is stored or evicted: the router's publishing.
        self.on_change: Callable[[bytes, bool], None] | None = None

    def has(self, key: bytes) -> bool:
        return key in self.index

    def put(self, keys: list[bytes], rows: torch.Tensor) -> int:
        """Store rows under keys (refreshing keys already present). Evicts the least
        recently used unpinned entries for room; stops when everything left is pinned.
        Returns rows stored."""
        stored = 0
        for i, key in enumerate(keys):
            slot = self.index.get(key)
            if slot is not None:
                self.index.move_to_end(key)
                continue
            if not self.alloc.num_free and not self._evict_one():
                break
            slot = self.alloc.alloc(1)[0]
            self.rows[slot].copy_(rows[i])
            self.alloc.park([slot])
            self.index[key] = slot
            self._key_of[slot] = key
            stored += 1
            if self.on_change is not None:
                self.on_change(key, True)
        return stored

    def _evict_one(self) -> bool:
        for key, slot in self.index.items():
            if slot not in self._pins:
                del self.index[key], self._key_of[slot]
                self.alloc.unpark([slot])
                self.alloc.free([slot])
                self.evicted += 1
                if self.on_change is not None:
                    self.on_change(key, False)
                return True
        return False

    def pin(self, keys: list[bytes]) -> list[int]:
        """Keep these entries (all present) until `unpin`; returns their slots."""
        slots = []
        for key in keys:
            slot = self.index[key]
            self.index.move_to_end(key)
            c = self._pins.get(slot, 0)
            if c == 0:
                self.alloc.unpark([slot])
            self._pins[slot] = c + 1
            slots.append(slot)
        return slots

    def unpin(self, slots: list[int]) -> None:
        for slot in slots:
            c = self._pins[slot] - 1
            if c:
                self._pins[slot] = c
            else:
                del self._pins[slot]
                self.alloc.park([slot])

    def check_integrity(self) -> None:
        a = self.alloc
        a.check_integrity()
        assert len(self.index) == len(self._key_of) == a.num_evictable + a.num_in_use, \
            f"{self.name}: {len(self.index)} keys for {a.num_evictable + a.num_in_use} slots"
        for key, slot in self.index.items():
            assert self._key_of[slot] == key, f"{self.name}: slot {slot} under two keys"
            want = IN_USE if slot in self._pins else EVICTABLE
            assert a._state[slot] == want, f"{self.name}: slot {slot} in the wrong state"

    def stats(self) -> dict[str, int]:
        return self.alloc.stats()


class HostPool:
    def __init__(self, budget: int, row_bytes: dict[str, int], row_elems: dict[str, int],
                 weights: dict[str, int], dtype: torch.dtype, pin: bool = False):
        """`row_bytes` / `row_elems`: per kind ('f', 's'); `weights`: each kind's share of the
        budget (L1's pool bytes)."""
        total = sum(weights.values()) or 1
        self.budget = budget
        self.stores: dict[str, HostStore] = {}
        for kind, rb in row_bytes.items():
            cap = int(budget * weights[kind] / total) // rb if rb else 0
            self.stores[kind] = HostStore(f"host-{kind}", cap, row_elems[kind], dtype, pin)

    def check_integrity(self) -> None:
        for s in self.stores.values():
            s.check_integrity()

    def stats(self) -> dict[str, dict[str, int]]:
        return {k: s.stats() for k, s in self.stores.items()}
