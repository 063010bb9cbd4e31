"""KVTensors: the K and V storage of one pool's layers, on one device.

Each layer gets one K and one V tensor shaped [num_pages * page_size, kv_heads, head_dim],
indexed by slot (page * page_size + offset). Pools of one engine may differ in head count
and head dims (MiMo-V2-Flash: 4 KV heads on full layers, 8 on SWA layers). The page
bookkeeping lives in `KVPool`; only storage imports torch.
"""
from __future__ import annotations

import torch

from .layout import LayerKV


class KVTensors:
    def __init__(self, layers: tuple[LayerKV, ...], slots: int,
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
        dtype = dtype or torch.float32
        self.k = [torch.zeros(slots, lay.kv_heads, lay.k_dim, dtype=dtype, device=device)
                  for lay in layers]
        self.v = [torch.zeros(slots, lay.kv_heads, lay.v_dim, dtype=dtype, device=device)
                  for lay in layers]
