"""The vocabulary projection, with an exact fast path for greedy decoding.

On a CPU the head dominates decode: 262k x 640 weights are read for every token. With int8
weights, `greedy` first scores the vocabulary with an int8 x int8 product (activations
quantized per row; VNNI, about 1.5-2x faster than the weight-only kernel), whose error is
bounded per token:

    |approx_j - exact_j| = s_j |(s_x x_q - x) . w_j| <= ||s_x x_q - x|| * s_j ||w_j||

Every token whose approximate score lies within twice the largest bound of the best one is
then rescored exactly (float32, same int8 weights), so the returned token is the argmax of the
exact logits: a tie-break by lowest id included, as torch.argmax does.

`screen_int4()` adds a faster, approximate path for steps of at most `INT4_MAX_ROWS` rows:
the vocabulary is scored with a group-wise int4 copy of those int8 weights (half the bytes,
and the int4 kernel is the fastest weight-only one for a single row), and its `INT4_TOP`
best tokens are rescored exactly as above. The result is the exact argmax unless the true
one ranks below `INT4_TOP` in the int4 scores, which no error bound rules out (a worst-case
bound is ~20 logits wide, useless) but the typical int4 error (~0.4 logits rms on Gemma 3
270M, where the true argmax ranked at most 3rd) makes very unlikely outside near-ties.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import QUANT_MAX_ROWS, Linear

INT4_GROUP = 32         # weights per (scale, zero) pair along the hidden dim
INT4_MAX_ROWS = 4       # above this, the int8 x int8 product is faster than int4 weight-only
INT4_TOP = 64           # int4 candidates rescored exactly per row
BOUND_TOP = 16          # int8 scores taken per row before the bound's threshold is applied


class LMHead(nn.Module):
    def __init__(self, linear: Linear):
        super().__init__()
        self.linear = linear
        self._ready = False
        self._int4: tuple[torch.Tensor, torch.Tensor] | None = None   # (packed, scales+zeros)

    def screen_int4(self) -> bool:
        """Build the int4 screening copy from the int8 weights (see the module docstring).
        False (nothing built) without int8 weights, or when the hidden size does not split
        into groups or the vocabulary into the kernel's 16-row tiles."""
        w8, s8 = self.linear.w_int8, self.linear.w_scale
        # (the packing kernel takes vocabularies in multiples of 16 rows)
        if w8 is None or s8 is None or w8.shape[1] % INT4_GROUP or w8.shape[0] % 16 \
                or w8.device.type != "cpu":
            return False
        scale8 = s8.float()
        V, K = w8.shape
        packs, szs = [], []
        for a in range(0, V, 32768):            # float32 temporaries one slice at a time
            w = (w8[a:a + 32768].float() * scale8[a:a + 32768, None]).view(-1, K // INT4_GROUP,
                                                                           INT4_GROUP)
            lo, hi = w.amin(-1), w.amax(-1)
            step = ((hi - lo) / 15).clamp(min=1e-10)
            q = torch.round((w - lo[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
            # The kernel dequantizes (q - 8) * scale + zero.
            szs.append(torch.stack([step, lo + 8 * step], -1).transpose(0, 1))
            packs.append(q.view(-1, K))
        q = torch.cat(packs)
        self._int4 = (torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1),
                      torch.cat(szs, 1).contiguous().to(torch.bfloat16))
        return True

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab]."""
        return self.linear(h).float()

    def _argmax_bf16(self, h: torch.Tensor, logits: torch.Tensor) -> list[int]:
        """The argmax of float32 logits from bf16 ones: the bf16 product rounds each logit
        to 8 bits (0.125 apart at 16-32), so the best ones can tie, or swap within a step.
        Every token within one bf16 step of a row's best is rescored in float32 (the same
        bf16 weights) and the best of those wins, the lower id on a tie."""
        best = logits.max(dim=1).values                                           # [rows]
        step = torch.exp2(torch.floor(torch.log2(best.abs().clamp(min=2.0 ** -120))) - 7)
        near = logits >= (best - step)[:, None]
        out = torch.argmax(logits, dim=1)           # the answer where one token is near
        w = self.linear.weight
        for r in torch.nonzero(near.sum(dim=1) > 1).view(-1).tolist():
            cand = torch.nonzero(near[r]).view(-1)
            exact = w.index_select(0, cand).float() @ h[r].float()
            out[r] = cand[torch.argmax(exact)]
        return out.tolist()

    def _weights_int8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 weights and their row scales (quantize_int8 sets both)."""
        w8, s8 = self.linear.w_int8, self.linear.w_scale
        assert w8 is not None and s8 is not None, "the int8 paths run on int8 weights only"
        return w8, s8

    def _prepare(self) -> None:
        w8, s8 = self._weights_int8()
        self.scale = s8.float()
        self.row_bound = w8.float().norm(dim=1) * self.scale      # s_j ||w_j||
        self.max_bound = float(self.row_bound.max())
        self._ready = True

    def greedy(self, h: torch.Tensor, allowed: torch.Tensor | None = None) -> list[int]:
        """Exact argmax of each row's logits; with `allowed` (bool [rows, >= vocab]), over
        the allowed tokens only (a grammar's mask: the int8 bound then picks candidates
        among them)."""
        q = self.linear.qweight
        if q is not None and allowed is None and h.shape[0] <= QUANT_MAX_ROWS:
            # the argmax of the kernels' logits (the ones `logits` returns), fused: the
            # [rows, vocab] scores are never written
            return q.topk(h, 1)[1][:, 0].tolist()
        if self.linear.w_int8 is None:
            logits = self.logits(h)
            if allowed is not None:
                logits.masked_fill_(~allowed[:, :logits.shape[1]], float("-inf"))
            if self.linear.weight.dtype == torch.bfloat16:
                return self._argmax_bf16(h, logits)
            return torch.argmax(logits, dim=-1).tolist()
        if not self._ready:
            self._prepare()
        if self._int4 is not None and h.shape[0] <= INT4_MAX_ROWS:
            return self._greedy_int4(h, allowed)
        w8 = self.linear.w_int8
        x = h.float()
        sx = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        xq = torch.round(x / sx).clamp(-127, 127).to(torch.int8)
        # The approximate scores divided by the row's positive s_x (the same order within a
        # row, and one pass over [rows, vocab] fewer).
        a = torch._int_mm(xq, w8.t()) * self.scale                       # [rows, vocab]
        if allowed is not None:
            a.masked_fill_(~allowed[:, :a.shape[1]], float("-inf"))
        err = (xq.float() * sx - x).norm(dim=1)                          # [rows]
        top = a.topk(min(BOUND_TOP, a.shape[1]), dim=1)
        sx = sx.squeeze(1)
        best = top.values[:, 0] * sx
        # Float32 rounding of both sides is far below this slack.
        slack = 1e-3 * (1.0 + best.abs())
        thr = (best - 2.0 * err * self.max_bound - slack) / sx          # in a's units
        out = []
        for i in range(x.shape[0]):
            v = top.values[i]
            # Every candidate is among the top ones when the last of them is below the
            # threshold (the usual case); else the whole row is searched.
            cand = (top.indices[i][v >= thr[i]].sort().values if v[-1] < thr[i]
                    else torch.nonzero(a[i] >= thr[i]).squeeze(1))
            out.append(self._rescore(x[i], cand, allowed, i))
        return out

    def _rescore(self, x: torch.Tensor, cand: torch.Tensor, allowed: torch.Tensor | None,
                 i: int) -> int:
        """The token among `cand` (ascending ids: argmax then breaks an exact tie by the
        lowest id) with the highest exact logit for hidden row `x` (row `i` of `allowed`)."""
        if cand.numel() == 0:       # nothing allowed (cannot happen for a live grammar)
            assert allowed is not None
            cand = torch.nonzero(allowed[i]).squeeze(1)[:1]
        exact = (self._weights_int8()[0].index_select(0, cand).float() * self.scale[cand, None]) @ x
        return int(cand[torch.argmax(exact)])

    def _greedy_int4(self, h: torch.Tensor, allowed: torch.Tensor | None) -> list[int]:
        assert self._int4 is not None, "greedy() takes this path only once screen_int4() built it"
        packed, sz = self._int4
        approx = torch.ops.aten._weight_int4pack_mm_for_cpu(h.to(torch.bfloat16), packed,
                                                            INT4_GROUP, sz)
        if allowed is not None:
            approx.masked_fill_(~allowed[:, :approx.shape[1]], float("-inf"))
        top = approx.topk(INT4_TOP, dim=1)
        x = h.float()
        return [self._rescore(x[i], top.indices[i][top.values[i] > float("-inf")].sort().values,
                              allowed, i) for i in range(h.shape[0])]

    def logits_for(self, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """float32 logits of tokens `idx` for one hidden row `h`, from the weights `greedy`
        treats as exact (the int8 copy dequantized, when there is one)."""
        lin = self.linear
        if lin.qweight is not None:
            return lin.qweight.select_rows(idx).matmul(h.reshape(1, -1))[0]
        if lin.w_int8 is not None:
            if not self._ready:
                self._prepare()
            w = lin.w_int8.index_select(0, idx).float() * self.scale[idx, None]
        else:
            w = lin.weight.index_select(0, idx).float()
        return w @ h.float()
