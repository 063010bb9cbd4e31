"""The plain layers' elementwise ops on the C++ kernels (csrc/elementwise.cpp,
csrc/fused_norms.cpp) where they load: RMSNorm, the gated MLP's act(gate) * up, the q/k
heads' norm with RoPE, and the residual sum with the norms around it, in the activation's
dtype, one parallel pass each. Each function returns None when it does not apply (another
device or dtype, no kernels, autograd recording), and the caller runs its PyTorch
reference instead."""
from __future__ import annotations

import torch

from . import extension

ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}     # HF name -> the kernel's
_EMPTY = torch.empty(0)     # the kernels' "none" for an optional tensor


def _applies(x: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float32)
            and x.dim() >= 2 and x.numel() > 0 and not torch.is_grad_enabled())


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor | None:
    """x [..., n] * rsqrt(mean(x^2) + eps) * scale, scale float32 [n] (or [h, n]: row r of
    x's flattened rows takes scale row r % h), in x's dtype."""
    ext = extension.load() if _applies(x) and scale.dtype == torch.float32 else None
    if ext is None:
        return None
    n = x.shape[-1]
    y = ext.rms_norm_rows(x.reshape(-1, n).contiguous(), scale.contiguous(), float(eps))
    return y.view(x.shape)


def act_mul(gu: torch.Tensor, act: str) -> torch.Tensor | None:
    """act(gate) * up of gu [..., 2I] (gate columns first), in gu's dtype."""
    ext = extension.load() if _applies(gu) and act in ACTS else None
    if ext is None:
        return None
    two_i = gu.shape[-1]
    m = ext.act_mul_rows(gu.reshape(-1, two_i).contiguous(), ACTS[act])
    return m.view(*gu.shape[:-1], two_i // 2)


def qk_norm_rope(qkv: torch.Tensor, heads: int, d: int, scale: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """The first `heads` heads of width d in qkv [T, C]: RMSNorm by `scale` (float32
    [heads, d]; None: no norm), then rotate-half RoPE by tables cos/sin [T, d] in qkv's
    dtype (sin with the sign folded in): [T, heads, d], rounded as the modules round."""
    ok = (_applies(qkv) and qkv.dim() == 2 and cos.dtype == qkv.dtype == sin.dtype
          and (scale is None or scale.dtype == torch.float32))
    ext = extension.load() if ok else None
    if ext is None:
        return None
    return ext.qk_norm_rope_rows(qkv.contiguous(), heads, d,
                                 _EMPTY if scale is None else scale.contiguous(), float(eps),
                                 cos.contiguous(), sin.contiguous())


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, w1: torch.Tensor | None,
                 w2: torch.Tensor | None, eps: float, y_dtype: torch.dtype | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(x + rms_norm(h) * w1, rms_norm(that) * w2) for the float32 residual stream x [T, n]
    and a block's output h (float32 or bfloat16; its norm rounded to its dtype): w1 None
    adds h itself, w2 None skips the second norm. Scales float32 [n]. The second in float32,
    or rounded to bfloat16 with `y_dtype` bfloat16 (the same bits as casting after)."""
    ok = (_applies(x) and x.dtype == torch.float32 and x.dim() == 2 and h.shape == x.shape
          and h.dtype in (torch.float32, torch.bfloat16)
          and all(w is None or w.dtype == torch.float32 for w in (w1, w2))
          and y_dtype in (None, torch.float32, torch.bfloat16))
    ext = extension.load() if ok else None
    if ext is None:
        return None
    xn, y = ext.add_rms_norm_rows(x.contiguous(), h.contiguous(),
                                  _EMPTY if w1 is None else w1.contiguous(),
                                  _EMPTY if w2 is None else w2.contiguous(), float(eps),
                                  y_dtype == torch.bfloat16)
    return xn, (None if w2 is None else y)
