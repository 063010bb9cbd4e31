"""Building blocks shared by the model definitions. Plain PyTorch, no framework."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import elementwise
from ..cpu.qmatrix import QuantMatrix

# Below this many rows a matmul is a GEMV, bound by weight bytes: the int8 weight-only kernel
# reads half the bytes of bf16. Above it the dense bf16 GEMM wins (int8 kernel is not tiled
# for large M), so both copies are kept when int8 is on.
INT8_MAX_ROWS = 8
# Steps of at most this many rows use a Linear's GGUF blocks (`qweight`) through the C++
# kernels; larger ones (prefill) use the dense weight unless `prefill_blocks` is set (chosen
# at start-up where the blocks' GEMM measured faster: engine/prefill_matmul.py).
QUANT_MAX_ROWS = 16
# Steps of at most this many rows that take the dense weight use its oneDNN-packed copy
# (`w_packed`) where one was made (AMX CPUs, engine/prefill_matmul.py): torch's GEMM repacks
# the weight on every call, which costs a 256-row product a third of its time there, and
# from 384 rows on the packed call measured slower than the plain one.
PACKED_MAX_ROWS = 256


def gemm_rows(rows: int) -> int:
    """The row count a dense half-precision product of `rows` rows runs at on the CPU (zero
    rows appended). oneDNN, torch's GEMM for bf16 there, builds and keeps a kernel for every
    row count it is given, and the first product at a new count measured 4-8x a warm one
    (~5-17 ms per weight shape on the AMX Xeon), paid by every prompt of a new length. So
    counts above QUANT_MAX_ROWS are rounded up to multiples of 32 to 512 rows, of 64 to
    1,024, of 128 beyond: at most 1/8 more rows from 256 on (513 -> 576), and a bounded set
    of kernels (28 up to a 1,536-token chunk)."""
    if rows <= QUANT_MAX_ROWS:
        return rows
    step = 32 if rows <= 512 else 64 if rows <= 1024 else 128
    return -(-rows // step) * step

# Checkpoint tensors (names under a layer's prefix) that the shared modules stack by rows into
# one Linear: attention.py's q/k/v, mlp.py's gate/up. A loader that lays each group out as
# consecutive rows of one buffer in the model's dtype (gguf_loader) spares `stack_rows` a copy.
STACKED_ROWS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                ("mlp.gate_proj", "mlp.up_proj"))


def stack_rows(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """`torch.cat(parts).to(dtype)`; a view of their buffer instead when the parts already
    are its consecutive rows, in `dtype` (the same values, no copy)."""
    first, end = parts[0], parts[0].data_ptr()
    base = first.untyped_storage().data_ptr()
    for p in parts:
        if p.dtype != dtype or p.dim() != 2 or not p.is_contiguous() or p.data_ptr() != end \
                or p.shape[1] != first.shape[1] or p.untyped_storage().data_ptr() != base:
            return torch.cat(parts).to(dtype)
        end += p.numel() * p.element_size()
    return first.as_strided((sum(p.shape[0] for p in parts), first.shape[1]), (first.shape[1], 1))


def quantize_int8(module: nn.Module) -> None:
    """Give every `Linear` inside `module` its int8 copy (the bf16 weight stays)."""
    for m in module.modules():
        if isinstance(m, Linear):
            m.quantize_int8()


class Linear(nn.Module):
    """y = x @ W.T (no bias). Optionally keeps, for small batches, an int8 per-row copy of W
    or W's GGUF blocks (`qweight`, see mimo.cpu.qmatrix). `source`: the checkpoint tensors
    stacked by rows into W, in order, so that their blocks can be found for it."""

    def __init__(self, weight: torch.Tensor, source: tuple[str, ...] = ()):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.source = source
        self.w_int8: torch.Tensor | None = None
        self.w_scale: torch.Tensor | None = None
        self.qweight: QuantMatrix | None = None
        self.prefill_blocks = False     # steps of more than QUANT_MAX_ROWS rows use qweight too
        self.w_packed: torch.Tensor | None = None     # oneDNN's layout of `weight` (pack())

    def pack(self) -> None:
        """Keep `weight` in oneDNN's packed layout too (an opaque mkldnn tensor, the same
        values), for steps of up to PACKED_MAX_ROWS rows. Needs torch built with oneDNN."""
        self.w_packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().contiguous(),
                                                                None)

    def quantize_int8(self) -> None:
        w = self.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        self.w_int8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.w_scale = scale.to(torch.bfloat16)

    def input_dtype(self, rows: int) -> torch.dtype | None:
        """The dtype `forward` casts an input of `rows` rows to (None: the GGUF blocks take
        it as it comes), so that whoever computes the input can write it so directly."""
        if self.qweight is not None and (self.prefill_blocks or rows <= QUANT_MAX_ROWS):
            return None
        return self.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inputs come in the residual stream's float32 (DecoderLM) or the weights' dtype;
        # the product runs in the weights' dtype.
        dtype = self.input_dtype(x.numel() // x.shape[-1])
        if dtype is None:
            assert self.qweight is not None
            return self.qweight.matmul(x).to(self.weight.dtype)
        x = x.to(dtype)
        if self.w_int8 is not None and x.dtype == torch.bfloat16:
            rows = x.numel() // x.shape[-1]
            if rows <= INT8_MAX_ROWS:
                y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, -1), self.w_int8, self.w_scale)
                return y.reshape(*x.shape[:-1], -1)
        if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) \
                and not torch.compiler.is_compiling():
            return self._cpu_half(x)
        return F.linear(x, self.weight)

    def _cpu_half(self, x: torch.Tensor) -> torch.Tensor:
        """The dense product on oneDNN at a `gemm_rows` row count, on the packed weight for
        steps of up to PACKED_MAX_ROWS rows where there is one."""
        x2 = x.reshape(-1, x.shape[-1])
        rows = x2.shape[0]
        padded = gemm_rows(rows)
        if padded != rows:
            x2 = F.pad(x2, (0, 0, 0, padded - rows))      # zero rows after the asked ones
        if self.w_packed is not None and padded <= PACKED_MAX_ROWS:
            y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.w_packed, None,
                                                   "none", [], "")
        else:
            y = F.linear(x2, self.weight)
        return y[:rows].view(*x.shape[:-1], y.shape[-1])


class RMSNorm(nn.Module):
    """Gemma-style RMSNorm: computed in float32, scaled by (1 + w). `weight` may be [dim] or,
    for per-head norms applied to several heads' stacked rows at once, [heads, dim]."""

    def __init__(self, dim: int, eps: float, weight: torch.Tensor | None = None):
        super().__init__()
        self.dim = dim
        self.eps = eps
        w = torch.zeros(dim) if weight is None else weight
        self.scale = nn.Parameter(1.0 + w.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = elementwise.rms_norm(x, self.scale, self.eps)       # the C++ kernel on CPU
        if y is not None:
            return y
        if self.scale.dim() == 1:
            return F.rms_norm(x.float(), (self.dim,), self.scale, self.eps).to(x.dtype)
        return (F.rms_norm(x.float(), (self.dim,), None, self.eps) * self.scale).to(x.dtype)


def add_norm(x: torch.Tensor, h: torch.Tensor, norm_h: RMSNorm | None,
             norm_sum: RMSNorm | None, y_dtype: torch.dtype | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The residual step `x + norm_h(h)` (h itself where norm_h is None) and `norm_sum` of
    that sum (None where norm_sum is None), cast to `y_dtype` if given (what the next matmul
    reads: `Linear.input_dtype`): one C++ pass over the float32 residual stream where it
    applies (Gemma-style norms of one epsilon), the same values as the modules."""
    norms = [n for n in (norm_h, norm_sum) if n is not None]
    if all(type(n) is RMSNorm and n.scale.dim() == 1 for n in norms) \
            and len({n.eps for n in norms}) <= 1:
        eps = norms[0].eps if norms else 0.0
        fused = elementwise.add_rms_norm(x, h, None if norm_h is None else norm_h.scale,
                                         None if norm_sum is None else norm_sum.scale, eps,
                                         y_dtype)
        if fused is not None:
            return fused
    x = x + (h if norm_h is None else norm_h(h))
    y = None if norm_sum is None else norm_sum(x)
    return x, (y if y is None or y_dtype is None else y.to(y_dtype))


class LlamaRMSNorm(RMSNorm):
    """RMSNorm scaled by w itself (HF's LlamaRMSNorm). `scale` holds w exactly rather than
    (w - 1) + 1. As in transformers, the float32 normalised value is cast back to the
    activation dtype before the multiply by w (which is in that dtype too)."""

    def __init__(self, dim: int, eps: float, weight: torch.Tensor, dtype: torch.dtype):
        super().__init__(dim, eps)
        self.scale = nn.Parameter(weight.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.dim,), self.scale.float(), self.eps)
        return self.scale * F.rms_norm(x.float(), (self.dim,), None, self.eps).to(x.dtype)


class Rotary(nn.Module):
    """Non-interleaved (rotate-half) RoPE. `tables(positions)` is computed once per forward
    and shared by every layer of a kind; `rotate` is then three elementwise ops.

    Partial RoPE: build with `dim` = the rotated dims only; `rotate` rotates the first `dim`
    dims of each head and passes the rest through (transformers' partial_rotary_factor)."""

    cos: torch.Tensor     # buffers [max_pos, dim], in the model dtype
    sin: torch.Tensor

    def __init__(self, dim: int, theta: float, max_pos: int, scaling: float = 1.0,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary dim must be even, got {dim}")
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        inv = inv / scaling
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        # Tables in the model dtype, as transformers casts cos/sin to the activations' dtype.
        # Both halves of a row hold the same angles: each is computed once (the values of
        # sin/cos of the duplicated angles, at half the start-up cost).
        sin, cos = freqs.sin().to(dtype), freqs.cos().to(dtype)
        self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)
        # sin with the rotate-half sign folded in: rot(x) * sin == flip_halves(x) * sin_signed
        self.register_buffer("sin", torch.cat([-sin, sin], dim=-1), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.cos.index_select(0, positions).unsqueeze(1),
                self.sin.index_select(0, positions).unsqueeze(1))

    @staticmethod
    def norm_rotate(qkv: torch.Tensor, heads: int, d: int, norm: RMSNorm | None,
                    tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The first `heads` heads of width d in qkv [T, C], each normed by `norm` (Gemma's
        per-head RMSNorm, scale [heads, d]; None: none) and rotated: [T, heads, d]. One C++
        pass where it applies (the same rounding), else the two modules."""
        cos, sin = tables
        T = qkv.shape[0]
        plain = norm is None or (type(norm) is RMSNorm and tuple(norm.scale.shape) == (heads, d))
        if plain and cos.dim() == 3 and cos.shape[1] == 1 and cos.shape[-1] == d:
            y = elementwise.qk_norm_rope(qkv, heads, d, None if norm is None else norm.scale,
                                         norm.eps if norm is not None else 0.0,
                                         cos.view(T, d), sin.view(T, d))
            if y is not None:
                return y
        x = qkv[:, :heads * d].view(T, heads, d)
        if norm is not None:
            x = norm(x)
        return Rotary.rotate(x, tables)

    @staticmethod
    def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [T, heads, head_dim]; head_dim may exceed the tables' dim (partial RoPE)."""
        cos, sin = tables
        T, H, D = x.shape
        R = cos.shape[-1]
        if R < D:
            return torch.cat([Rotary.rotate(x[..., :R], tables), x[..., R:]], dim=-1)
        swapped = x.reshape(T, H, 2, D // 2).flip(2).reshape(T, H, D)
        return x * cos + swapped * sin
