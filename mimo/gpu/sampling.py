"""Token sampling from a batch of logits, each row with its own settings.

`process_logits` applies a request's logit processors (grammar mask, logit_bias, min_tokens,
penalties; order and definitions in SamplingParams) to one row; `filtered_probs` turns a row
into the distribution sampled from. Speculative verification calls the same two functions
per draft position, so its target distribution is exactly plain decoding's.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def process_logits(logits: torch.Tensor, params, prompt_ids: Sequence[int],
                   prior: Sequence[int], eos_ids: frozenset[int] | set[int],
                   allowed: torch.Tensor | None = None) -> torch.Tensor:
    """logits [V] float32 -> processed copy. `prior`: the output tokens before this
    position (penalty counts, min_tokens); `allowed`: bool [V] of grammar-allowed tokens."""
    x = logits.clone()
    V = x.numel()
    if allowed is not None:
        x = x.masked_fill(~allowed[:V], float("-inf"))
    if params.logit_bias:
        ids = torch.tensor([t for t in params.logit_bias if t < V], dtype=torch.int64)
        if ids.numel():
            x[ids] += torch.tensor([params.logit_bias[int(t)] for t in ids], dtype=x.dtype)
    if len(prior) < params.min_tokens:
        ban = [t for t in (set(eos_ids) | set(params.stop_token_ids)) if t < V]
        if ban:
            ban_t = torch.tensor(ban, dtype=torch.int64)
            rest = None if allowed is None else allowed[:V].clone()
            if rest is not None:
                rest[ban_t] = False
            # Not when the grammar allows nothing else (its document is complete).
            if rest is None or bool(rest.any()):
                x[ban_t] = float("-inf")
    if params.repetition_penalty != 1.0:
        seen = torch.unique(torch.tensor(list(prompt_ids) + list(prior), dtype=torch.int64))
        seen = seen[seen < V]
        v = x[seen]
        r = params.repetition_penalty
        x[seen] = torch.where(v > 0, v / r, v * r)
    if prior and (params.frequency_penalty or params.presence_penalty):
        ids, counts = torch.unique(torch.tensor(list(prior), dtype=torch.int64),
                                   return_counts=True)
        keep = ids < V
        ids, counts = ids[keep], counts[keep].to(x.dtype)
        x[ids] -= counts * params.frequency_penalty + params.presence_penalty
    return x


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                   min_p: float = 0.0) -> torch.Tensor:
    """The distribution a request samples from: softmax of logits [V] (float32) after
    temperature, min-p, top-k and top-p. temperature must be > 0. Speculative decoding's
    rejection sampling uses the same function, so its target distribution is exactly this one."""
    x = logits / temperature
    if min_p > 0:
        p = torch.softmax(x, dim=-1)
        x = x.masked_fill(p < min_p * p.max(), float("-inf"))
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
               generator: torch.Generator | None, min_p: float = 0.0) -> int:
    """logits: [V] float32. temperature 0 is greedy (argmax, first index on ties)."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = filtered_probs(logits, temperature, top_p, top_k, min_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: torch.Tensor, token: int, top: int
                  ) -> tuple[int, float, tuple[tuple[int, float], ...]]:
    """(token, its log-probability, the `top` most likely (id, log-probability)) under the
    raw distribution softmax(logits [V] float32)."""
    return logprob_entry(torch.log_softmax(logits.float(), dim=-1), token, top)


def logprob_entry(lp: torch.Tensor, token: int, top: int
                  ) -> tuple[int, float, tuple[tuple[int, float], ...]]:
    """`token_logprob` from a row of log-probabilities already computed."""
    alts: tuple[tuple[int, float], ...] = ()
    if top:
        v, i = torch.topk(lp, top)
        alts = tuple(zip(i.tolist(), v.tolist()))
    return token, float(lp[token]), alts


def sample(head, hidden: torch.Tensor, params: list, generators: list) -> list[int]:
    """One token per row of `hidden`, with temperature / top-p / top-k only (no processors).
    `head` has `logits(h)` (float32) and `greedy(h)` (the argmax token ids, possibly without
    materialising every logit)."""
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
            out[i] = sample_row(logits[j], p.temperature, p.top_p, p.top_k, generators[i],
                                p.min_p)
    return out


# A grammar that allows at most this many tokens next (a key, an enum, punctuation: most
# positions of a JSON document) gets logits for those tokens only, not for the vocabulary.
SPARSE_MAX = 4096


def sparse_sample(head, h: torch.Tensor, allowed: torch.Tensor, p, generator) -> int | None:
    """The token for one row whose grammar allows few tokens (None: too many, use the full
    logits). Masking the full logits and filtering them (temperature, min-p, top-k, top-p)
    gives the same distribution as filtering the allowed subset's logits: every filter
    only ranks or normalises over tokens with finite logits."""
    # numpy's flatnonzero is an order of magnitude faster than torch.nonzero on a CPU bool
    # vector of the vocabulary's size.
    if allowed.device.type != "cpu":
        return None
    a = allowed.numpy()
    if not 0 < np.count_nonzero(a) <= SPARSE_MAX:    # counting is cheap, listing is not
        return None
    ids = np.flatnonzero(a)
    idx = torch.from_numpy(ids)
    sub = head.logits_for(h, idx)
    return int(idx[sample_row(sub, p.temperature, p.top_p, p.top_k, generator, p.min_p)])


def _reshapes(p) -> bool:
    """A processor besides the grammar mask (logit_bias, min_tokens, penalties)."""
    return bool(p.logit_bias or p.min_tokens or p.frequency_penalty or p.presence_penalty
                or p.repetition_penalty != 1.0)


def greedy_under_grammar_only(p) -> bool:
    """Greedy under a grammar and nothing else that shapes the logits or reports them."""
    return (p.constraint is not None and p.greedy and p.logprobs is None and p.min_p == 0
            and not _reshapes(p))


def sample_seqs(head, hidden: torch.Tensor, seqs: list, allowed: list,
                fixed: dict[int, int] | None = None) -> tuple[list[int], list]:
    """One token per row of `hidden` for each request in `seqs` (its params, prompt, output
    so far, generator), with every logit processor; `allowed[i]`: its grammar mask or None;
    `fixed`: rows whose token the caller already chose (row -> token, no logprobs).
    Returns the tokens and, per request, its token_logprob tuple or None.

    Batched where it is per-token work on the whole vocabulary: one logits matmul, one
    log-softmax for the rows that report logprobs (raw logits, before any mask), one masked
    fill for the rows under a grammar and one argmax for the greedy rows."""
    fixed = fixed or {}
    plain = [i for i, s in enumerate(seqs) if not s.params.needs_logits and allowed[i] is None
             and i not in fixed]
    tokens: list[int] = [fixed.get(i, 0) for i in range(len(seqs))]
    lps: list = [None] * len(seqs)
    if plain:
        h = hidden if len(plain) == len(seqs) else hidden[torch.tensor(plain)]
        for i, t in zip(plain, sample(head, h, [seqs[i].params for i in plain],
                                      [seqs[i].generator for i in plain])):
            tokens[i] = t
    # Under a grammar alone (no logprobs, no other processor): the few allowed tokens' logits
    # when the grammar allows few; greedy rows without full logits either way.
    sparse = set()
    for i, s in enumerate(seqs):
        if i in fixed:
            continue
        if allowed[i] is not None and s.params.logprobs is None and not _reshapes(s.params):
            t = sparse_sample(head, hidden[i], allowed[i], s.params, s.generator)
            if t is not None:
                tokens[i] = t
                sparse.add(i)
    mg = [i for i, s in enumerate(seqs) if allowed[i] is not None and s.params.greedy
          and i not in sparse and s.params.logprobs is None and s.params.min_p == 0
          and not _reshapes(s.params)]
    if mg:
        for i, t in zip(mg, head.greedy(hidden[torch.tensor(mg)],
                                        torch.stack([allowed[i] for i in mg]))):
            tokens[i] = t
    done = set(plain) | set(mg) | sparse | set(fixed)
    rest = [i for i in range(len(seqs)) if i not in done]
    if not rest:
        return tokens, lps
    logits = head.logits(hidden[torch.tensor(rest)])
    with_lp = [j for j, i in enumerate(rest) if seqs[i].params.logprobs is not None]
    raw_lp = torch.log_softmax(logits[torch.tensor(with_lp)], dim=-1) if with_lp else None
    masked = [j for j, i in enumerate(rest) if allowed[i] is not None]
    if masked:
        V = logits.shape[1]
        rows = torch.tensor(masked)
        m = torch.stack([allowed[rest[j]][:V] for j in masked])
        logits[rows] = torch.where(m, logits[rows], torch.tensor(float("-inf")))
    argmax_rows = []
    for j, i in enumerate(rest):
        s = seqs[i]
        p = s.params
        if _reshapes(p):
            logits[j] = process_logits(logits[j], p, s.prompt_ids, s.output_ids, s.eos_ids,
                                       allowed[i])
        if p.temperature == 0:
            argmax_rows.append(j)
        else:
            tokens[i] = sample_row(logits[j], p.temperature, p.top_p, p.top_k, s.generator,
                                   p.min_p)
    if argmax_rows:
        best = torch.argmax(logits[torch.tensor(argmax_rows)], dim=-1).tolist()
        for j, t in zip(argmax_rows, best):
            tokens[rest[j]] = t
    for k, j in enumerate(with_lp):
        i = rest[j]
        lps[i] = logprob_entry(raw_lp[k], tokens[i], seqs[i].params.logprobs)
    return tokens, lps
