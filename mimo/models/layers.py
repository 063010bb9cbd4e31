"""Building blocks shared by the model definitions. Plain PyTorch, no framework."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Below this many rows a matmul is a GEMV, bound by weight bytes: the int8 weight-only kernel
# reads half the bytes of bf16. Above it the dense bf16 GEMM wins (int8 kernel is not tiled
# for large M), so both copies are kept when int8 is on.
INT8_MAX_ROWS = 8


class Linear(nn.Module):
    """y = x @ W.T (no bias). Optionally keeps an int8 per-row copy of W for small batches."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.w_int8: torch.Tensor | None = None
        self.w_scale: torch.Tensor | None = None

    def quantize_int8(self) -> None:
        w = self.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        self.w_int8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.w_scale = scale.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w_int8 is not None and x.dtype == torch.bfloat16:
            rows = x.numel() // x.shape[-1]
            if rows <= INT8_MAX_ROWS:
                y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, -1), self.w_int8, self.w_scale)
                return y.reshape(*x.shape[:-1], -1)
        return F.linear(x, self.weight)


class RMSNorm(nn.Module):
    """Gemma-style RMSNorm: computed in float32, scaled by (1 + w)."""

    def __init__(self, dim: int, eps: float, weight: torch.Tensor | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim) if weight is None else weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class Rotary(nn.Module):
    """Non-interleaved (rotate-half) RoPE with a precomputed cos/sin table."""

    def __init__(self, dim: int, theta: float, max_pos: int, scaling: float = 1.0):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        inv = inv / scaling
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, dim], positions: [T]."""
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        xf = x.float()
        h = xf.shape[-1] // 2
        rot = torch.cat([-xf[..., h:], xf[..., :h]], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)
