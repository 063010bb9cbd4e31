"""The torch backend with its decode rows computed by the C++ kernel (mimo/cpu): keys and
values read in place from the pool through each sequence's slots, no gathered copy and no
padded SDPA call per layer. Prefill chunks stay on the torch path (SDPA in query blocks),
and so does everything when the kernels are not loaded."""
from __future__ import annotations

import torch

from ..cpu import extension
from .attention import AttnBatch, TorchAttention

_NO_SINKS = torch.empty(0)


class CPUAttention(TorchAttention):
    def __init__(self, ext=None):
        self.ext = ext if ext is not None else extension.load()

    def forward(self, q, k, v, k_cache, v_cache, batch: AttnBatch, scale, sinks=None):
        if self.ext is None or not batch.all_decode or q.device.type != "cpu":
            return super().forward(q, k, v, k_cache, v_cache, batch, scale, sinks)
        k_cache.index_copy_(0, batch.write_slots, k)
        v_cache.index_copy_(0, batch.write_slots, v)
        slots, lens = batch.decode_slots, batch.decode_lens
        if lens is None:
            if batch.decode_mask is None:
                lens = torch.full((slots.shape[0],), slots.shape[1], dtype=torch.int64)
            else:       # the padded keys are the trailing ones, masked with -inf
                lens = (batch.decode_mask.view(slots.shape[0], -1) == 0).sum(1)
        out = self.ext.paged_decode_attention(
            q.float().contiguous(), k_cache, v_cache, slots, lens, float(scale),
            _NO_SINKS if sinks is None else sinks)
        return out.to(q.dtype)
