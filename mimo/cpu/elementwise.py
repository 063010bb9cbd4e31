"""The plain layers' elementwise ops on the C++ kernels (csrc/elementwise.cpp) where they
load: RMSNorm and the gated MLP's act(gate) * up, in the activation's dtype, one parallel
pass each. Each function returns None when it does not apply (another device or dtype, no
kernels), and the caller runs its PyTorch reference instead."""
from __future__ import annotations

import torch

from . import extension

ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}     # HF name -> the kernel's


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
