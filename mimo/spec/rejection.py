"""Turning the target's verdict on a draft into tokens, without changing what is sampled.

Greedy: accept drafts while each equals the target's argmax at its position, then append the
target's own token; the output is the one plain greedy decoding gives, token for token.

Sampling (Leviathan et al. 2023, Chen et al. 2023): draft x_i drawn from q_i is accepted with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the token is drawn from the
residual max(p_i - q_i, 0) normalised, and if all drafts pass a bonus token comes from p_k.
Each emitted token is then distributed exactly as p. A deterministic drafter (n-gram) has
q_i = a point mass on x_i: accept with probability p_i(x_i), else sample p_i with x_i removed.
"""
from __future__ import annotations

import torch


def greedy_accept(draft: list[int], target: list[int]) -> list[int]:
    """target: the argmax at each of len(draft) + 1 positions."""
    out: list[int] = []
    for d, t in zip(draft, target):
        out.append(t)
        if d != t:
            return out
    out.append(target[len(draft)])
    return out


def rejection_sample(draft: list[int], probs: torch.Tensor, generator: torch.Generator | None,
                     draft_probs: torch.Tensor | None = None) -> list[int]:
    """probs: [len(draft) + 1, V] target distributions (after temperature/top-k/top-p).
    draft_probs: [len(draft), V] the distributions the drafts were drawn from, or None for
    a deterministic drafter."""
    out: list[int] = []
    for i, x in enumerate(draft):
        p = probs[i]
        px = float(p[x])
        qx = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand(1, generator=generator))
        if qx > 0 and u * qx < px:
            out.append(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p - draft_probs[i], min=0.0)
        total = float(residual.sum())
        # total == 0 needs p == q (then x was accepted surely); guard rounding anyway.
        dist = residual / total if total > 0 else p
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return out
