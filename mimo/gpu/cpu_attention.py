"""The torch backend with the C++ kernels (mimo/cpu) where they apply: decode rows read
keys and values in place from the pool through each sequence's slots (no gathered copy,
no padded SDPA call per layer), and prefill chunks run one of mimo's flash kernels, chosen
by the CPU: on AMX, the one on oneDNN's brgemm tiles (`prefill_attention_amx`: 1.5-1.9x
torch's flash kernel on Gemma 3's chunks, which takes an explicit mask for every chunk
that starts mid-sequence or sits in a window); with AVX512-BF16 but no AMX, the bfloat16
dot-product one (about 2.5x torch's float32 flash kernel there). No mask tensor either
way: a span's offset and window say what each query sees. Anything else stays on the
torch path, and so does everything when the kernels are not loaded."""
from __future__ import annotations

import logging

import torch

from ..cpu import decode_ops, extension
from ..cpu.features import cpu_info
from .attention import AttnBatch, TorchAttention

_NO_SINKS = torch.empty(0)
log = logging.getLogger("mimo.engine")


# 'amx' / 'kernel' (the bf16 dot-product kernel) / 'torch' force one path for every chunk a
# kernel could take, where the build and CPU have it (else torch's); 'auto' picks by CPU.
PREFILL_CHOICES = ("auto", "amx", "kernel", "torch")


def prefill_path(choice: str, ext, flags: frozenset[str]) -> str:
    """The path prefill chunks take: 'amx', 'kernel' or 'torch'."""
    if choice not in PREFILL_CHOICES:
        raise ValueError(f"prefill must be one of {', '.join(PREFILL_CHOICES)}, "
                         f"not {choice!r}")
    amx = ext is not None and bool(ext.prefill_attention_amx_ok()) and "amx_bf16" in flags
    bf16 = ext is not None and bool(ext.prefill_attention_ok())
    if choice == "auto":
        return "amx" if amx else "kernel" if bf16 else "torch"
    return choice if {"amx": amx, "kernel": bf16, "torch": True}[choice] else "torch"


def _span_table(batch: AttnBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(every span's key slots end to end, [S, 5] int64 rows (row0, n, slot0, L, offset),
    window) for `prefill_attention_amx_spans`; built once a step, on the batch."""
    if batch.backend_spans is None:
        spans = batch.prefills
        windows = {s.window for s in spans}
        if len(windows) > 1:
            raise ValueError(f"one layer's spans have different windows: {sorted(windows)}")
        rows, slot0 = [], 0
        for s in spans:
            n = s.rows.stop - s.rows.start
            L = s.kv_slots.shape[0]
            rows.append((s.rows.start, n, slot0, L, s.offset))
            slot0 += L
        slots = (torch.cat([s.kv_slots for s in spans]) if spans
                 else torch.empty(0, dtype=torch.int64))
        batch.backend_spans = (slots.contiguous(), torch.tensor(rows, dtype=torch.int64).view(-1, 5),
                               windows.pop() if windows else 0)
    return batch.backend_spans


def _rows_fit(src: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether `write_rows` copies src's rows into cache as they are: same dtype, each row
    one contiguous block, a contiguous cache."""
    return (src.dtype == cache.dtype and cache.is_contiguous() and src.shape[0] > 0
            and src.shape[1:] == cache.shape[1:] and src[0].is_contiguous())


class CPUAttention(TorchAttention):
    def __init__(self, ext=None, prefill: str = "auto"):
        self.ext = ext if ext is not None else extension.load()
        # The fused decode layer's attention kernel, from the same build.
        self.ops = None if self.ext is None else decode_ops.load(self.ext.isa())
        self.prefill = prefill_path(prefill, self.ext, cpu_info().flags)
        if self.prefill != "torch":
            log.info("prefill attention: mimo's %s kernel",
                     "AMX (oneDNN brgemm)" if self.prefill == "amx" else "AVX512-BF16")

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
        if self.prefill == "amx":       # every span in one call, its rows of `out` in place
            slots, table, window = _span_table(batch)
            self.ext.prefill_attention_amx_spans(q.contiguous(), k_cache, v_cache, slots, table,
                                                 window, float(scale), sk, out)
            return out
        for span in batch.prefills:     # each writes its rows of `out` (bf16) in place
            self.ext.prefill_attention(q[span.rows].contiguous(), k_cache, v_cache,
                                       span.kv_slots, span.offset, span.window, float(scale),
                                       sk, out[span.rows])
        return out

    def write(self, k, v, k_cache, v_cache, batch: AttnBatch) -> None:
        """The step's new K/V into the caches: the C++ row copy (one thread, no parallel
        region to wake) where every row is written, else torch's index_copy_."""
        if self.ext is None or batch.write_rows is not None or k.device.type != "cpu" \
                or not all(_rows_fit(src, cache) for src, cache in ((k, k_cache), (v, v_cache))):
            return super().write(k, v, k_cache, v_cache, batch)
        self.ext.write_rows(k_cache, batch.write_slots, k)
        self.ext.write_rows(v_cache, batch.write_slots, v)

    def _prefill_fits(self, q, k_cache, v_cache) -> bool:
        bf16 = torch.bfloat16
        return (self.prefill != "torch" and q.dtype == bf16 and k_cache.dtype == bf16
                and v_cache.dtype == bf16 and k_cache.is_contiguous()
                and v_cache.is_contiguous() and q.shape[-1] % 2 == 0
                and v_cache.shape[-1] % 64 == 0)

    def _decode(self, q, k_cache, v_cache, batch: AttnBatch, scale, sinks) -> torch.Tensor:
        """float32 [B, Hq, Dv] for the decode rows' queries q [B, Hq, D]. A bf16 q: the fused
        decode layer's kernel (by KV head, split along the keys, the weights rounded to bf16
        as the plain bf16 layer rounds them, both products on vdpbf16ps where the CPU has
        them; half the time in a mixed step). float32: the per-query-head kernel, whose sums'
        order the float32 GGUF agreement tests hold at their margin."""
        slots, lens = batch.decode_slots, batch.decode_lens
        if lens is None:
            if batch.decode_mask is None:
                lens = torch.full((slots.shape[0],), slots.shape[1], dtype=torch.int64)
            else:       # the padded keys are the trailing ones, masked with -inf
                lens = (batch.decode_mask.view(slots.shape[0], -1) == 0).sum(1)
        sk = _NO_SINKS if sinks is None else sinks
        if (self.ops is not None and q.dtype == torch.bfloat16
                and q.shape[1] // k_cache.shape[1] <= self.ops.max_rep):
            return self.ops.decode_attention(q.float().contiguous(), k_cache, v_cache, slots,
                                             lens.contiguous(), float(scale), sk, True)
        return self.ext.paged_decode_attention(q.float().contiguous(), k_cache, v_cache, slots,
                                               lens, float(scale), sk)
