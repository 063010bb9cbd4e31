"""Choosing a worker: the predicted window-safe hit, the score, and the local fallback.

`predicted_tokens` is the L1 rule a worker's tree applies (`RadixTree.match` on the prompt
but its last token): the leading run of pages whose full KV the worker holds, cut back to the
longest prefix whose window before its end has live SWA on every page (`best_hit`, the rule
the tiers plan hits with). With window rebuild on, a
token-equal run past the last live window counts from the rebuild's start, as `match` does.
The score is the report's
    match_weight * predicted_cached_fraction - normalized_load,
load = the routers' in-flight requests on the worker (all replicas, from Redis) + its queued
and running uncached tokens / load_token_unit (its heartbeat), normalized by the mean load
over the candidates + 1 (so one request more on an idle cluster weighs less than on a busy
one, and a worker twice as loaded as the mean loses a full match's worth). Ties go to the
lower load, then to rendezvous hashing of the prompt's first page key, so replicas that read
the same state pick the same worker.

Without Redis: rendezvous hashing of the first `fallback_pages` page keys over the healthy
workers, bounded by load (a worker with more than 1.25 x the mean + 1 of this router's
in-flight requests is skipped), so a session keeps landing on one worker while no state
is shared.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..kvcache.retention import window_first_page
from ..kvcache.tiers.hit_plan import best_hit


def predicted_tokens(full_ok: Sequence[bool], swa_ok: Sequence[bool] | None, window: int,
                     page_size: int, rebuild: int = 0) -> int:
    """Tokens a worker's match would reuse; `swa_ok` None: no SWA pool (full-kv mode).
    `rebuild`: the worker's window-rebuild receptive field (tokens, 0: off): past a missing
    window, a match starts about that far before the token-equal end (`RadixTree.match`)."""
    P = page_size
    q = best_hit(full_ok, swa_ok, window, P)
    m = 0
    while m < len(full_ok) and full_ok[m]:
        m += 1
    if swa_ok is not None and rebuild > 0 and m > q:
        r = max((window_first_page(m * P, window, P) * P - (rebuild - (window - 1))) // P, 0)
        if r > q:
            return r * P
    return q * P


def prompt_pages(prompt_len: int, page_size: int) -> int:
    """Pages a match can reuse: whole pages of the prompt but its last token."""
    return max(prompt_len - 1, 0) // page_size


def _rank(key: bytes, worker: str) -> bytes:
    return hashlib.blake2b(key + worker.encode(), digest_size=8).digest()


def rendezvous(key: bytes, workers: Sequence[str]) -> list[str]:
    """Workers in the key's rendezvous order (highest random weight first)."""
    return sorted(workers, key=lambda w: _rank(key, w), reverse=True)


@dataclass(frozen=True)
class Candidate:
    url: str
    predicted: int      # tokens
    load: float


@dataclass(frozen=True)
class Choice:
    url: str
    predicted: int
    score: float
    how: str            # "score", "fallback" or "round-robin"


def choose(cands: Sequence[Candidate], prompt_len: int, match_weight: float,
           tie_key: bytes) -> Choice:
    mean = sum(c.load for c in cands) / len(cands)
    order = {w: i for i, w in enumerate(rendezvous(tie_key, [c.url for c in cands]))}

    def score(c: Candidate) -> float:
        frac = c.predicted / prompt_len if prompt_len else 0.0
        return match_weight * frac - c.load / (mean + 1.0)
    best = min(cands, key=lambda c: (-round(score(c), 9), c.load, order[c.url]))
    return Choice(best.url, best.predicted, score(best), "score")


def fallback(key: bytes, workers: Sequence[str], inflight: dict[str, int]) -> str:
    mean = sum(inflight.get(w, 0) for w in workers) / len(workers)
    ordered = rendezvous(key, workers)
    for w in ordered:
        if inflight.get(w, 0) <= 1.25 * mean + 1:
            return w
    return ordered[0]
