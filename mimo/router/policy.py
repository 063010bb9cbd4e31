"""Choosing a worker: the predicted window-safe hit, the score, and the local fallback.

`predicted_tokens` is the L1 rule a worker's tree applies (`RadixTree.match` on the prompt
but its last token): the leading run of pages whose full KV the worker holds, cut back to the
longest prefix whose window before its end has live SWA on every page (`best_hit`, the rule
the tiers plan hits with). With window rebuild on, a
token-equal run past the last live window counts from the rebuild's start, as `match` does.

`tiered` adds the tiers below, as a worker's admission uses them (tiers/promotion.py, the
engine's L3 loader): the longest hit over L1, the worker's host tier (L2) and the shared store
(L3) by the same `best_hit` rule, with L1's own window-safe hit as the floor; the pages it
adds are promoted into the tree, whose match then gives the length (`tokens`: what the
worker's usage reports as cached). For the score, each page past L1's own hit is credited by
where its full KV comes from: 1 if the tree holds it, `l2_credit` from the host tier,
`l3_credit` from the shared store (a load costs a copy or a round trip, and the store's set is
learned, so it may hold less than published).

The score is the report's
    match_weight * predicted_cached_fraction - normalized_load,
load = the routers' in-flight requests on the worker (all replicas, from Redis) + its queued
and running uncached tokens / load_token_unit (its heartbeat), normalized by the mean load
over the candidates + 1 (so one request more on an idle cluster weighs less than on a busy
one, and a worker twice as loaded as the mean loses a full match's worth). Ties go to the
lower load, then to rendezvous hashing of the prompt's first page key, so replicas that read
the same state pick the same worker.

A request that continues an earlier one on a worker (its prompt runs through that prompt's
end: a conversation's next turn, an agent's next step) has its fraction there weighed by
`continuation_weight` as well. Its history is private: sent elsewhere, it is recomputed in
full and leaves a copy no other request reuses. A prefix that requests merely share (a
system prompt) is worth copying to a less loaded worker, where the sessions placed later
reuse it; weighing it as much would pile new sessions onto the first workers that hold it.

A request with a `prompt_cache_key` goes to the worker its key's rendezvous order puts first
(`affine`), unless that worker is overloaded (the same bound as the fallback's): a client
that names its session gets it kept in one place even before any of its prefixes is cached
or published. Without Redis the fallback hashes the key instead of the prompt.

Without Redis: rendezvous hashing of the first `fallback_pages` page keys over the healthy
workers, bounded by load (a worker with more than 1.25 x the mean + 1 of this router's
in-flight requests is skipped), so a session keeps landing on one worker while no state
is shared.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..kvcache.radix.retention import window_first_page
from ..kvcache.tiers.hit_plan import best_hit, window_of


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


@dataclass(frozen=True)
class Prediction:
    tokens: int         # what the worker's match would reuse, every tier's pages loaded
    l1: int             # the tree's own match (`predicted_tokens`)
    l2_pages: int       # pages of `tokens` whose full KV comes from the host tier
    l3_pages: int       # ... from the shared store
    credit: float       # tokens weighted by where their KV comes from (the score's)


Pages = tuple[Sequence[bool], Sequence[bool]]     # (full KV present, SWA KV present)


def tiered(full_ok: Sequence[bool], swa_ok: Sequence[bool] | None, window: int,
           page_size: int, rebuild: int = 0, l2: Pages | None = None, l3: Pages | None = None,
           l2_credit: float = 1.0, l3_credit: float = 1.0) -> Prediction:
    """The prediction with the host tier (`l2`) and the shared store (`l3`) below the tree
    (`full_ok`, `swa_ok` as for `predicted_tokens`); None: no such tier."""
    P, n_all = page_size, len(full_ok)
    l1 = predicted_tokens(full_ok, swa_ok, window, P, rebuild)
    below = [t for t in (l2, l3) if t is not None]
    if not below or not n_all:
        return Prediction(l1, l1, 0, 0, float(l1))
    full_any = [full_ok[i] or any(t[0][i] for t in below) for i in range(n_all)]
    swa_any = (None if swa_ok is None else
               [swa_ok[i] or any(t[1][i] for t in below) for i in range(n_all)])
    floor = best_hit(full_ok, swa_ok, window, P)
    n = best_hit(full_any, swa_any, window, P, floor)
    tokens = l1
    if n > floor:
        # The tree after the promotion: the hit's full pages, and its window's SWA.
        win = set(window_of(n, window, P)) if swa_ok is not None else set()
        tokens = max(l1, predicted_tokens(
            [full_ok[i] or i < n for i in range(n_all)],
            None if swa_ok is None else [swa_ok[i] or i in win for i in range(n_all)],
            window, P, rebuild))
    from_l2 = from_l3 = 0
    for i in range(l1 // P, tokens // P):
        if full_ok[i]:
            continue
        if l2 is not None and l2[0][i]:
            from_l2 += 1
        else:
            from_l3 += 1
    credit = tokens - (from_l2 * (1 - l2_credit) + from_l3 * (1 - l3_credit)) * P
    return Prediction(tokens, l1, from_l2, from_l3, credit)


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
    predicted: float    # tokens credited (`Prediction.credit`)
    load: float
    continues: bool = False     # the prompt continues an earlier request on this worker


@dataclass(frozen=True)
class Choice:
    url: str
    predicted: float
    score: float
    how: str            # "score", "affinity", "fallback" or "round-robin"


def choose(cands: Sequence[Candidate], prompt_len: int, match_weight: float,
           tie_key: bytes, continuation_weight: float = 1.0) -> Choice:
    mean = sum(c.load for c in cands) / len(cands)
    order = {w: i for i, w in enumerate(rendezvous(tie_key, [c.url for c in cands]))}

    def score(c: Candidate) -> float:
        frac = c.predicted / prompt_len if prompt_len else 0.0
        weight = match_weight * (continuation_weight if c.continues else 1.0)
        return weight * frac - c.load / (mean + 1.0)
    best = min(cands, key=lambda c: (-round(score(c), 9), c.load, order[c.url]))
    return Choice(best.url, best.predicted, score(best), "score")


OVERLOAD = 1.25     # a worker above OVERLOAD x the mean load + 1 is skipped (fallback, affinity)


def affinity_key(session: str) -> bytes:
    """The rendezvous key of a `prompt_cache_key`."""
    return hashlib.blake2b(b"prompt_cache_key\0" + session.encode(), digest_size=16).digest()


def affine(key: bytes, cands: Sequence[Candidate]) -> Choice | None:
    """The worker a session key pins (the first in the key's rendezvous order, the same on
    every replica and for every request of the session, so its KV accumulates there) unless
    its load is over OVERLOAD x the mean + 1: then None, and the score decides."""
    mean = sum(c.load for c in cands) / len(cands)
    first = rendezvous(key, [c.url for c in cands])[0]
    c = next(c for c in cands if c.url == first)
    if c.load > OVERLOAD * mean + 1:
        return None
    return Choice(c.url, c.predicted, 0.0, "affinity")


def fallback(key: bytes, workers: Sequence[str], inflight: dict[str, int]) -> str:
    mean = sum(inflight.get(w, 0) for w in workers) / len(workers)
    ordered = rendezvous(key, workers)
    for w in ordered:
        if inflight.get(w, 0) <= OVERLOAD * mean + 1:
            return w
    return ordered[0]
