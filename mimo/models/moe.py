"""Sparse mixture of experts with sigmoid scoring (DeepSeek-V3 style "noaux_tc" routing, as
MiMo-V2-Flash uses it): no shared expert.

Routing is computed in float32 exactly as transformers' MiMoV2FlashTopkRouter does:
sigmoid scores, a per-expert correction bias that only steers the *choice*, group-limited
top-k (the best `topk_group` of `n_group` groups, a group scored by its two best experts),
then the chosen experts' unbiased scores, renormalised and scaled.

On a CPU the experts run one by one over the tokens routed to them: correctness first, and
with top-8 of 256 a decode token touches 8 experts, so the loop is short.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import GatedMLP
from .untraced import untraced


class SparseMoE(nn.Module):
    # Its forward loops over the chosen experts on the host (`.tolist()`): a decode step
    # through it cannot be captured in a CUDA graph (engine/graph_decode.py reads this).
    syncs_host = True

    def __init__(self, router_w: torch.Tensor, bias: torch.Tensor | None,
                 gate_up: torch.Tensor, down: torch.Tensor, top_k: int, n_group: int = 1,
                 topk_group: int = 1, norm_topk_prob: bool = True, scaling: float = 1.0):
        """router_w [E, H] and bias [E] stay float32 (the checkpoint keeps them so);
        gate_up [E, 2I, H] (gate rows first, then up), down [E, H, I]."""
        super().__init__()
        E = router_w.shape[0]
        if E % n_group:
            raise ValueError(f"{E} experts do not split into {n_group} groups")
        self.router = nn.Parameter(router_w.float(), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(E) if bias is None else bias.float(),
                                 requires_grad=False)
        self.experts = nn.ModuleList(GatedMLP(gate_up[e], down[e]) for e in range(E))
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm_topk_prob, self.scaling = norm_topk_prob, scaling

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k] float32, expert ids [T, k])."""
        scores = F.linear(x.float(), self.router).sigmoid()
        choice = scores + self.bias
        if self.n_group > 1:
            T, E = choice.shape
            grouped = choice.view(T, self.n_group, E // self.n_group)
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)              # [T, groups]
            keep = torch.zeros_like(group_scores)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False).indices, 1)
            mask = keep.bool().unsqueeze(-1).expand_as(grouped).reshape(T, E)
            choice = choice.masked_fill(~mask, float("-inf"))
        idx = choice.topk(self.top_k, dim=-1, sorted=False).indices
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scaling, idx

    # Data-dependent: which experts run, and on which rows, is known only at run time. A
    # compiled layer breaks its graph here.
    @untraced
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.route(x)
        out = torch.zeros_like(x)
        for e in torch.unique(idx).tolist():          # ascending, as transformers iterates
            rows, slot = torch.where(idx == e)
            y = self.experts[e](x.index_select(0, rows))
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out
