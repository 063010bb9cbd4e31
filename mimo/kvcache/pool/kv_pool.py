"""KVPool: one kind of layer's pages (full or SWA): the allocator that hands them out and,
when the pool has storage, the K/V tensors they index (`KVTensors`).

A pool without storage is bookkeeping only: sizing, capacity benchmarks of models far
larger than this machine, and scheduler tests with no model. It never imports torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .allocator import PageAllocator
from .layout import LayerKV

if TYPE_CHECKING:
    import torch

    from .kv_tensors import KVTensors


class KVPool:
    def __init__(self, name: str, layers: tuple[LayerKV, ...], num_pages: int, page_size: int,
                 tensors: KVTensors | None = None):
        self.name = name
        self.layers = layers
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages, name)
        self.tensors = tensors

    def k(self, i: int) -> torch.Tensor:
        """K storage of the pool's i-th layer, [slots, kv_heads, k_dim]."""
        return self._storage().k[i]

    def v(self, i: int) -> torch.Tensor:
        """V storage of the pool's i-th layer, [slots, kv_heads, v_dim]."""
        return self._storage().v[i]

    def _storage(self) -> KVTensors:
        if self.tensors is None:
            raise RuntimeError(f"{self.name} pool is bookkeeping only (allocate=False)")
        return self.tensors

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
