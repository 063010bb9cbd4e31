"""KVTensors: the K and V storage of one pool's layers, on one device.

Each layer gets one K and one V tensor shaped [num_pages * page_size, kv_heads, head_dim],
indexed by slot (page * page_size + offset). Pools of one engine may differ in head count
and head dims (MiMo-V2-Flash: 4 KV heads on full layers, 8 on SWA layers). The page
bookkeeping lives in `KVPool`; only storage imports torch.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from .layout import LayerKV


class KVTensors:
    def __init__(self, layers: tuple[LayerKV, ...], slots: int,
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
        dtype = dtype or torch.float32
        self.k = [_zeros((slots, lay.kv_heads, lay.k_dim), dtype, device) for lay in layers]
        self.v = [_zeros((slots, lay.kv_heads, lay.v_dim), dtype, device) for lay in layers]


def _zeros(shape: tuple[int, int, int], dtype: torch.dtype, device: str | torch.device
           ) -> torch.Tensor:
    """Zeroed storage. On the CPU it comes from calloc (through numpy), whose large blocks are
    fresh pages the OS zeroes on first touch: `torch.zeros` writes every byte up front, about
    a second per GiB of start-up. Zeroed, not empty: attention reads whole pages, and garbage
    past a sequence's end could be NaN, which a zero softmax weight does not cancel."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = shape[0] * shape[1] * shape[2] * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(np.zeros(n + 64, dtype=np.uint8))
    skip = -raw.data_ptr() % 64                    # 64-byte aligned, as torch's allocator gives
    _no_huge_pages(raw)
    return raw[skip:skip + n].view(dtype).view(shape)


_MADV_NOHUGEPAGE = 15


def _no_huge_pages(t: torch.Tensor) -> None:
    """numpy asks for transparent huge pages on large blocks; the first write to each (the
    kernel zeroing 2 MiB) cost a prefill's cache writes about 0.4 ms per layer and chunk, as
    a sequence's pages are spread over the pool. 4 KiB pages fault in as they fill. A hint:
    where the kernel refuses it, nothing changes."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = 4096
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    if end > start:
        madvise(start, end - start, _MADV_NOHUGEPAGE)
