"""The vocabulary projection, with an exact fast path for greedy decoding.

On a CPU the head dominates decode: 262k x 640 weights are read for every token. With int8
weights, `greedy` first scores the vocabulary with an int8 x int8 product (activations
quantized per row; VNNI, about 1.5-2x faster than the weight-only kernel), whose error is
bounded per token:

    |approx_j - exact_j| = s_j |(s_x x_q - x) . w_j| <= ||s_x x_q - x|| * s_j ||w_j||

Every token whose approximate score lies within twice the largest bound of the best one is
then rescored exactly (float32, same int8 weights), so the returned token is the argmax of the
exact logits: a tie-break by lowest id included, as torch.argmax does.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import Linear


class LMHead(nn.Module):
    def __init__(self, linear: Linear):
        super().__init__()
        self.linear = linear
        self._ready = False

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab]."""
        return self.linear(h).float()

    def _prepare(self) -> None:
        w8 = self.linear.w_int8
        self.scale = self.linear.w_scale.float()
        self.row_bound = w8.float().norm(dim=1) * self.scale      # s_j ||w_j||
        self.max_bound = float(self.row_bound.max())
        self._ready = True

    def greedy(self, h: torch.Tensor, allowed: torch.Tensor | None = None) -> list[int]:
        """Exact argmax of each row's logits; with `allowed` (bool [rows, >= vocab]), over
        the allowed tokens only (a grammar's mask: the int8 bound then picks candidates
        among them)."""
        if self.linear.w_int8 is None:
            logits = self.logits(h)
            if allowed is not None:
                logits.masked_fill_(~allowed[:, :logits.shape[1]], float("-inf"))
            return torch.argmax(logits, dim=-1).tolist()
        if not self._ready:
            self._prepare()
        w8 = self.linear.w_int8
        x = h.float()
        sx = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        xq = torch.round(x / sx).clamp(-127, 127).to(torch.int8)
        approx = torch._int_mm(xq, w8.t()) * (self.scale * sx)          # [rows, vocab]
        if allowed is not None:
            approx.masked_fill_(~allowed[:, :approx.shape[1]], float("-inf"))
        err = (xq.float() * sx - x).norm(dim=1)                          # [rows]
        best = approx.max(dim=1).values
        # Float32 rounding of both sides is far below this slack.
        slack = 1e-3 * (1.0 + best.abs())
        thr = best - 2.0 * err * self.max_bound - slack
        out = []
        for i in range(x.shape[0]):
            cand = torch.nonzero(approx[i] >= thr[i]).squeeze(1)
            if cand.numel() == 0:       # nothing allowed (cannot happen for a live grammar)
                assert allowed is not None
                cand = torch.nonzero(allowed[i]).squeeze(1)[:1]
            exact = (w8.index_select(0, cand).float() * self.scale[cand, None]) @ x[i]
            out.append(int(cand[torch.argmax(exact)]))
        return out

    def logits_for(self, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """float32 logits of tokens `idx` for one hidden row `h`, from the weights `greedy`
        treats as exact (the int8 copy dequantized, when there is one)."""
        lin = self.linear
        if lin.w_int8 is not None:
            if not self._ready:
                self._prepare()
            w = lin.w_int8.index_select(0, idx).float() * self.scale[idx, None]
        else:
            w = lin.weight.index_select(0, idx).float()
        return w @ h.float()
