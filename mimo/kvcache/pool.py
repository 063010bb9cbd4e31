"""KV storage for one kind of layer.

A pool owns one K and one V tensor per layer it serves, each shaped
[num_pages * page_size, kv_heads, head_dim] and indexed by slot (page * page_size + offset),
plus the allocator that hands out its pages. Pools of one engine may differ in head count and
head dims (MiMo-V2-Flash: 4 KV heads on full layers, 8 on SWA layers).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .allocator import PageAllocator
from .layout import LayerKV


class KVPool(ABC):
    page_size: int
    allocator: PageAllocator

    @abstractmethod
    def k(self, i: int) -> torch.Tensor:
        """K storage of the pool's i-th layer, [slots, kv_heads, k_dim]."""

    @abstractmethod
    def v(self, i: int) -> torch.Tensor:
        """V storage of the pool's i-th layer, [slots, kv_heads, v_dim]."""

    def check_integrity(self) -> None:
        self.allocator.check_integrity()

    @property
    def num_slots(self) -> int:
        return self.allocator.capacity * self.page_size


class PagedKVPool(KVPool):
    """Tensors on one device. With `allocate=False` it is bookkeeping only (sizing and
    capacity benchmarks of models far larger than this machine)."""

    def __init__(self, name: str, layers: tuple[LayerKV, ...], num_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 allocate: bool = True):
        self.name = name
        self.layers = layers
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages, name)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        if allocate:
            slots = num_pages * page_size
            for l in layers:
                self._k.append(torch.zeros(slots, l.kv_heads, l.k_dim, dtype=dtype, device=device))
                self._v.append(torch.zeros(slots, l.kv_heads, l.v_dim, dtype=dtype, device=device))

    def k(self, i: int) -> torch.Tensor:
        return self._k[i]

    def v(self, i: int) -> torch.Tensor:
        return self._v[i]
