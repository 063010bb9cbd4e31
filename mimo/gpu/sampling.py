"""Token sampling from a batch of logits, each row with its own settings."""
from __future__ import annotations

import torch


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int
                   ) -> torch.Tensor:
    """The distribution a request samples from: softmax of logits [V] (float32) after
    temperature, top-k and top-p. temperature must be > 0. Speculative decoding's rejection
    sampling uses the same function, so its target distribution is exactly this one."""
    x = logits / temperature
    if top_k and top_k > 0 and top_k < x.numel():
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(0, idx, sorted_x)
    return torch.softmax(x, dim=-1)


def sample_row(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
               generator: torch.Generator | None) -> int:
    """logits: [V] float32. temperature 0 is greedy (argmax, first index on ties)."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = filtered_probs(logits, temperature, top_p, top_k)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(head, hidden: torch.Tensor, params: list, generators: list) -> list[int]:
    """One token per row of `hidden`. `head` has `logits(h)` (float32) and `greedy(h)` (the
    argmax token ids, possibly without materialising every logit)."""
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    out: list[int] = [0] * len(params)
    if greedy:
        rows = greedy if len(greedy) < len(params) else slice(None)
        h = hidden[rows] if isinstance(rows, slice) else hidden[torch.tensor(rows)]
        for i, t in zip(greedy, head.greedy(h)):
            out[i] = t
    rest = [i for i, p in enumerate(params) if p.temperature != 0]
    if rest:
        logits = head.logits(hidden[torch.tensor(rest)])
        for j, i in enumerate(rest):
            p = params[i]
            out[i] = sample_row(logits[j], p.temperature, p.top_p, p.top_k, generators[i])
    return out
