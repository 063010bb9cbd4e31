"""The torch backend with the C++ kernels (mimo/cpu) where they apply: decode rows read
keys and values in place from the pool through each sequence's slots (no gathered copy,
no padded SDPA call per layer), and prefill chunks run the bfloat16 flash kernel on CPUs
with AVX512-BF16 (about 2.5x torch's float32 flash kernel there; no mask tensor: a span's
offset and window say what each query sees). Anything else stays on the torch path, and so
does everything when the kernels are not loaded."""
from __future__ import annotations

import torch

from ..cpu import extension
from .attention import AttnBatch, TorchAttention

_NO_SINKS = torch.empty(0)


class CPUAttention(TorchAttention):
    def __init__(self, ext=None):
        self.ext = ext if ext is not None else extension.load()
        # The prefill kernel is in the avx512-vnni build and needs AVX512-BF16 to run (every
        # build answers `prefill_attention_ok`; the AVX2 one says no).
        self.prefill_kernel = self.ext is not None and bool(self.ext.prefill_attention_ok())

    def forward(self, q, k, v, k_cache, v_cache, batch: AttnBatch, scale, sinks=None):
        if self.ext is None or q.device.type != "cpu":
            return super().forward(q, k, v, k_cache, v_cache, batch, scale, sinks)
        if batch.all_decode:
            self.write(k, v, k_cache, v_cache, batch)
            return self._decode(q, k_cache, v_cache, batch, scale, sinks).to(q.dtype)
        if not self._prefill_fits(q, k_cache, v_cache):
            return super().forward(q, k, v, k_cache, v_cache, batch, scale, sinks)
        self.write(k, v, k_cache, v_cache, batch)
        out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
        if batch.decode_rows is not None:
            od = self._decode(q.index_select(0, batch.decode_rows), k_cache, v_cache, batch,
                              scale, sinks)
            out.index_copy_(0, batch.decode_rows, od.to(q.dtype))
        sk = _NO_SINKS if sinks is None else sinks.float().contiguous()
        for span in batch.prefills:
            out[span.rows] = self.ext.prefill_attention(
                q[span.rows].contiguous(), k_cache, v_cache, span.kv_slots, span.offset,
                span.window, float(scale), sk).to(q.dtype)
        return out

    def _prefill_fits(self, q, k_cache, v_cache) -> bool:
        bf16 = torch.bfloat16
        return (self.prefill_kernel and q.dtype == bf16 and k_cache.dtype == bf16
                and v_cache.dtype == bf16 and k_cache.is_contiguous()
                and v_cache.is_contiguous() and q.shape[-1] % 2 == 0
                and v_cache.shape[-1] % 64 == 0)

    def _decode(self, q, k_cache, v_cache, batch: AttnBatch, scale, sinks) -> torch.Tensor:
        """float32 [B, Hq, Dv] for the decode rows' queries q [B, Hq, D]."""
        slots, lens = batch.decode_slots, batch.decode_lens
        if lens is None:
            if batch.decode_mask is None:
                lens = torch.full((slots.shape[0],), slots.shape[1], dtype=torch.int64)
            else:       # the padded keys are the trailing ones, masked with -inf
                lens = (batch.decode_mask.view(slots.shape[0], -1) == 0).sum(1)
        return self.ext.paged_decode_attention(
            q.float().contiguous(), k_cache, v_cache, slots, lens, float(scale),
            _NO_SINKS if sinks is None else sinks)
