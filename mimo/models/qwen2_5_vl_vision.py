"""The Qwen2.5-VL vision transformer: patches of several images and videos in, their merged
embeddings (at the language model's width) out, concatenated in item order.

Shape of the computation, per layer: most layers attend within windows of
`window_size / patch_size` patches square (8x8 for 112 px / 14 px), the layers in
`fullatt_block_indexes` within a whole frame. To make the windows contiguous, tokens are
reordered once at the start (window by window, each window in 2x2 merge-block order) and put
back after the merger; the merger's 2x2 groups stay intact through the reorder.

Many items run in one forward without padding: attention is block-diagonal over segments
(windows or frames). Segments of equal length are gathered into one batched SDPA call, so a
layer costs a handful of calls (one per distinct length) however many items are packed.

Weights come in Hugging Face naming under `visual.` (loaders map `model.visual.` to it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig


def merged_tokens(grid_thw: torch.Tensor | list, merge: int) -> list[int]:
    """Embeddings each item yields: t * h * w / merge**2."""
    return [int(t) * int(h) * int(w) // merge ** 2 for t, h, w in torch.as_tensor(grid_thw).tolist()]


def split_embeds(embeds: torch.Tensor, grid_thw: torch.Tensor | list, merge: int = 2
                 ) -> list[torch.Tensor]:
    """The concatenated output of a batched forward -> one tensor per item."""
    return list(torch.split(embeds, merged_tokens(grid_thw, merge)))


@dataclass
class VisionPlan:
    """Everything about a batch that depends only on its grids, shared by every layer."""
    order: torch.Tensor            # [N] patch index at each reordered row (window order)
    restore: torch.Tensor          # [N / merge**2] merged row -> its row before reordering
    window_groups: list[torch.Tensor]   # per distinct window length: [segments, length] rows
    full_groups: list[torch.Tensor]     # the same for whole frames
    cos: torch.Tensor              # [N, head_dim] float32, in reordered row order
    sin: torch.Tensor


def _groups(lengths: list[int], device) -> list[torch.Tensor]:
    """Contiguous segments -> row indices, one [count, length] tensor per distinct length."""
    starts: dict[int, torch.Tensor] = {}
    by_len: dict[int, list[int]] = {}
    pos = 0
    for n in lengths:
        if n:
            by_len.setdefault(n, []).append(pos)
        pos += n
    for n, s in by_len.items():
        starts[n] = torch.tensor(s)[:, None] + torch.arange(n)[None, :]
    return [idx.to(device) for idx in starts.values()]


def build_plan(vc: VisionConfig, grid_thw: torch.Tensor | list, device) -> VisionPlan:
    m = vc.spatial_merge_size
    unit = m * m
    ws = vc.window_size // m // vc.patch_size       # window side in merged units
    head_dim = vc.hidden_size // vc.num_heads
    order_units, win_lens, frame_lens, hw_pos = [], [], [], []
    base = 0
    for t, h, w in torch.as_tensor(grid_thw).tolist():
        gh, gw = h // m, w // m
        # Windows tile each frame from its top-left corner; edge windows are smaller.
        idx = torch.arange(t * gh * gw).reshape(t, gh, gw)
        ph, pw = (-gh) % ws, (-gw) % ws
        idx = F.pad(idx, (0, pw, 0, ph), value=-1)
        nh, nw = (gh + ph) // ws, (gw + pw) // ws
        idx = idx.reshape(t, nh, ws, nw, ws).permute(0, 1, 3, 2, 4).reshape(t * nh * nw, ws * ws)
        valid = idx >= 0
        order_units.append(idx[valid] + base)
        win_lens += (valid.sum(1) * unit).tolist()
        frame_lens += [h * w] * t
        base += t * gh * gw
        # Patch (row, column) in merge-block-major order, as the patches arrive.
        hp = torch.arange(h)[:, None].expand(h, w).reshape(gh, m, gw, m).transpose(1, 2).flatten()
        wp = torch.arange(w)[None, :].expand(h, w).reshape(gh, m, gw, m).transpose(1, 2).flatten()
        hw_pos.append(torch.stack([hp, wp], dim=1).repeat(t, 1))
    units = torch.cat(order_units)
    order = (units[:, None] * unit + torch.arange(unit)).flatten()
    # 2-D rotary: a quarter of the head's frequencies per axis, both halves of rotate-half.
    inv = 1.0 / (vc.rope_theta ** (torch.arange(0, head_dim // 2, 2).float() / (head_dim // 2)))
    pos = torch.cat(hw_pos).index_select(0, order).float()
    freqs = torch.cat([pos[:, :1] * inv, pos[:, 1:] * inv], dim=1)
    emb = torch.cat([freqs, freqs], dim=1)
    return VisionPlan(order.to(device), torch.argsort(units).to(device),
                      _groups(win_lens, device), _groups(frame_lens, device),
                      emb.cos().to(device), emb.sin().to(device))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE in float32, back to x's dtype (as the reference does)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


class _RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back, times w (Qwen2's convention)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)


class _Affine(nn.Module):
    def __init__(self, w: dict, name: str):
        super().__init__()
        self.weight = nn.Parameter(w[name + ".weight"], requires_grad=False)
        self.bias = nn.Parameter(w[name + ".bias"], requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class VisionBlock(nn.Module):
    def __init__(self, vc: VisionConfig, w: dict, p: str):
        super().__init__()
        self.heads = vc.num_heads
        self.norm1 = _RMSNorm(w[p + "norm1.weight"], vc.rms_norm_eps)
        self.norm2 = _RMSNorm(w[p + "norm2.weight"], vc.rms_norm_eps)
        self.qkv = _Affine(w, p + "attn.qkv")
        self.proj = _Affine(w, p + "attn.proj")
        self.gate = _Affine(w, p + "mlp.gate_proj")
        self.up = _Affine(w, p + "mlp.up_proj")
        self.down = _Affine(w, p + "mlp.down_proj")

    def attention(self, x, plan: VisionPlan, groups: list[torch.Tensor]):
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.heads, -1).unbind(1)
        cos, sin = plan.cos[:, None], plan.sin[:, None]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = torch.empty_like(q)
        for idx in groups:              # every segment of one length in one call
            S, L = idx.shape
            flat = idx.reshape(-1)
            qs, ks, vs = (t.index_select(0, flat).view(S, L, self.heads, -1).transpose(1, 2)
                          for t in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs)
            out.index_copy_(0, flat, o.transpose(1, 2).reshape(S * L, self.heads, -1))
        return self.proj(out.reshape(N, -1))

    def forward(self, x, plan: VisionPlan, groups: list[torch.Tensor]):
        x = x + self.attention(self.norm1(x), plan, groups)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Qwen2_5_VisionTransformer(nn.Module):
    def __init__(self, vc: VisionConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 prefix: str = "visual."):
        super().__init__()
        self.cfg = vc
        w = {k[len(prefix):]: v.to(dtype) for k, v in weights.items() if k.startswith(prefix)}
        # The Conv3d has stride == kernel over [C, T, P, P] patches: a matmul with its
        # weight flattened in the same order as a patch row.
        self.patch_w = nn.Parameter(w["patch_embed.proj.weight"].reshape(vc.hidden_size, -1),
                                    requires_grad=False)
        self.blocks = nn.ModuleList(VisionBlock(vc, w, f"blocks.{i}.") for i in range(vc.depth))
        self.full = frozenset(vc.fullatt_block_indexes)
        self.ln_q = _RMSNorm(w["merger.ln_q.weight"], 1e-6)
        self.mlp0 = _Affine(w, "merger.mlp.0")
        self.mlp2 = _Affine(w, "merger.mlp.2")

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_w.dtype

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        """pixel_values [N, C*T*P*P] (the items' patch rows, concatenated in item order),
        grid_thw [items, 3] in patches -> embeddings [sum(t*h*w) / merge**2, out_hidden]."""
        vc = self.cfg
        if pixel_values.shape[-1] != vc.patch_dim:
            raise ValueError(f"patch rows must have {vc.patch_dim} values, "
                             f"got {pixel_values.shape[-1]}")
        plan = build_plan(vc, grid_thw, pixel_values.device)
        if pixel_values.shape[0] != plan.order.numel():
            raise ValueError(f"{pixel_values.shape[0]} patch rows for grids totalling "
                             f"{plan.order.numel()}")
        x = F.linear(pixel_values.to(self.dtype).index_select(0, plan.order), self.patch_w)
        for i, blk in enumerate(self.blocks):
            x = blk(x, plan, plan.full_groups if i in self.full else plan.window_groups)
        unit = vc.spatial_merge_size ** 2
        x = self.ln_q(x).view(-1, unit * vc.hidden_size)
        x = self.mlp2(F.gelu(self.mlp0(x)))
        return x.index_select(0, plan.restore)
