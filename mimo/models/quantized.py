"""Give a built model's `Linear`s their quantized blocks for the CPU kernels (mimo.cpu):
the GGUF file's own blocks (`use_gguf_blocks`: the weights llama.cpp computes with), or Q8_0
blocks made here from float weights (`quantize_q8_0`: safetensors checkpoints, tiny test
models). Both return what was done, for the start-up log and the benchmarks."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from ..cpu.qmatrix import NAMES, QuantMatrix, QuantPart
from .layers import Linear


@dataclass(frozen=True)
class QuantReport:
    quantized: int            # Linears that got blocks
    dense: int                # Linears left with their dense weight only
    bytes_per_token: int      # weight bytes one decode step reads (blocks + dense rest)
    types: dict[str, int]     # GGML type name -> bytes

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(self.types.items()))
        return (f"{self.quantized} quantized linears ({kinds}), {self.dense} dense; "
                f"{self.bytes_per_token / 2**20:.0f} MiB of weights read per decode step")


def _report(model: nn.Module) -> QuantReport:
    types: Counter[str] = Counter()
    q = d = total = 0
    for m in model.modules():
        if not isinstance(m, Linear):
            continue
        if m.qweight is not None:
            q += 1
            total += m.qweight.nbytes
            for p in m.qweight.parts:
                types[NAMES[p.qtype]] += p.data.numel()
        else:
            d += 1
            total += m.weight.numel() * m.weight.element_size()
    return QuantReport(q, d, total, dict(types))


def use_gguf_blocks(model: nn.Module, blocks: dict[str, QuantPart]) -> QuantReport:
    """Every Linear whose source tensors all have blocks gets them; a Linear whose blocks
    do not add up to its weight's shape is refused (the model and file disagree)."""
    for m in model.modules():
        if isinstance(m, Linear) and m.source and all(s in blocks for s in m.source):
            qm = QuantMatrix([blocks[s] for s in m.source])
            if qm.shape != tuple(m.weight.shape):
                raise ValueError(f"GGUF blocks of {', '.join(m.source)} make {qm.shape}, "
                                 f"the layer's weight is {tuple(m.weight.shape)}")
            m.qweight = qm
    return _report(model)


def repack_blocks(model: nn.Module, ext, types: frozenset[int]) -> QuantReport:
    """Every Linear's blocks of `types` (mimo.cpu.qmatrix.repack_types) in 8-row tiles, by
    the kernel build `ext`; the same values, reordered."""
    for m in model.modules():
        if isinstance(m, Linear) and m.qweight is not None:
            m.qweight = m.qweight.repacked(ext, types)
    return _report(model)


def q8_0_blocks(w: torch.Tensor) -> QuantPart:
    """float [rows, cols] -> Q8_0 blocks as ggml's quantize_row_q8_0 makes them: per block
    of 32 an fp16 scale amax/127 and int8 quants rounded half away from zero."""
    rows, cols = w.shape
    if cols % 32:
        raise ValueError(f"Q8_0 needs rows of a multiple of 32 elements, not {cols}")
    b = w.detach().float().reshape(rows, cols // 32, 32)
    d = b.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    v = b * inv[..., None]
    q = (v.sign() * torch.floor(v.abs() + 0.5)).to(torch.int8)
    scale = d.to(torch.float16).view(torch.uint8).reshape(rows, cols // 32, 2)
    data = torch.cat([scale, q.view(torch.uint8)], -1).reshape(rows, -1).contiguous()
    return QuantPart(data, 8, cols)


def quantize_q8_0(model: nn.Module) -> QuantReport:
    """Q8_0 blocks for every Linear with rows of a multiple of 32 elements. The dense weight
    (prefill's) becomes the blocks' values too: the model is then a Q8_0 checkpoint, and
    prefill and decode compute with the same weights."""
    for m in model.modules():
        if isinstance(m, Linear) and m.weight.shape[1] % 32 == 0:
            part = q8_0_blocks(m.weight)
            m.qweight = QuantMatrix([part])
            with torch.no_grad():
                m.weight.copy_(q8_0_values(part).to(m.weight.dtype))
    return _report(model)


def q8_0_values(part: QuantPart) -> torch.Tensor:
    """float32 [rows, cols] of Q8_0 blocks (scale * quant, as ggml dequantizes)."""
    b = part.data.view(part.rows, -1, 34)
    d = b[..., :2].contiguous().view(torch.float16).float()
    return (b[..., 2:].contiguous().view(torch.int8).float() * d).reshape(part.rows, part.cols)
