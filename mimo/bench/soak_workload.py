"""soak's workload: seeded requests sharing prefixes cut around page boundaries (pure)."""
from __future__ import annotations

import random
from dataclasses import dataclass

# Short common words: mostly one token each with their leading space.
WORDS = ("the of and to in is it that was for on are as with his they at be this have from "
         "or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could "
         "people my than first water been call who oil its now find long down day did get "
         "come made may part over new sound take only little work know place year live me "
         "back give most very after thing our just name good sentence man think say great "
         "where help through much before line right too mean old any same tell boy follow "
         "came want show also around form three small set put end does another well large "
         "must big even such because turn here why ask went men read need land different "
         "home us move try kind hand picture again change off play spell air away animal "
         "house point page letter mother answer found study still learn should world").split()


# ---- workload (pure) --------------------------------------------------------------------
@dataclass
class Workload:
    num_requests: int = 1000
    prefixes: int = 4
    max_prompt_tokens: int = 1500
    max_tokens: int = 48
    long_fraction: float = 0.05
    long_max_tokens: int = 256
    stream_fraction: float = 0.5
    text_fraction: float = 0.25
    disconnect_fraction: float = 0.3
    timeout_fraction: float = 0.1
    page_size: int = 16
    seed: int = 0
    vocab: tuple = (100, 20000)


def make_prefixes(w: Workload, rng: random.Random) -> tuple[list[list[int]], list[list[str]]]:
    """`w.prefixes` token-id prefixes and as many word prefixes, each max_prompt_tokens long."""
    ids = [[rng.randrange(*w.vocab) for _ in range(w.max_prompt_tokens)] for _ in range(w.prefixes)]
    words = [[rng.choice(WORDS) for _ in range(w.max_prompt_tokens)] for _ in range(w.prefixes)]
    return ids, words


def draw_cut(rng: random.Random, n: int, page: int) -> int:
    """How much of an n-token prompt comes from its prefix: n minus a suffix of 0-48, half the
    time snapped to a page boundary +-1 (where the cache's pages and windows are cut)."""
    cut = n - rng.randint(0, min(n, 48))
    if rng.random() < 0.5:
        cut = round(cut / page) * page + rng.choice((-1, 0, 1))
    return max(0, min(n, cut))


def draw_request(w: Workload, rng: random.Random, ids_pre, word_pre, index: int = 0) -> dict:
    """One request: {'prompt': ids or text, 'n': prompt length (words for text), 'max_tokens',
    'stream', 'long', 'action': 'complete' | 'disconnect' | 'timeout', 'after_chunks',
    'cancel_after_s'}."""
    long = rng.random() < w.long_fraction
    if long:
        n = rng.randint(max(1, int(0.9 * w.max_prompt_tokens)), w.max_prompt_tokens)
        max_tokens = rng.randint(min(w.max_tokens + 1, w.long_max_tokens), w.long_max_tokens)
    else:
        n = rng.randint(1, w.max_prompt_tokens)
        max_tokens = rng.randint(1, w.max_tokens)
    cut = draw_cut(rng, n, w.page_size)
    k = rng.randrange(w.prefixes)
    text = rng.random() < w.text_fraction
    if text:
        prompt = " ".join(word_pre[k][:cut] + [rng.choice(WORDS) for _ in range(n - cut)])
    else:
        prompt = ids_pre[k][:cut] + [rng.randrange(*w.vocab) for _ in range(n - cut)]
    req = {"index": index, "prompt": prompt, "n": n, "prefix": k, "cut": cut, "text": text,
           "max_tokens": max_tokens, "long": long, "stream": rng.random() < w.stream_fraction,
           "action": "complete", "after_chunks": None, "cancel_after_s": None}
    if req["stream"] and rng.random() < w.disconnect_fraction:
        req["action"] = "disconnect"
        if rng.random() < 0.25:         # before the first token: the server has not answered
            req["after_chunks"], req["cancel_after_s"] = 0, round(rng.uniform(0.0, 0.5), 3)
        else:
            req["after_chunks"] = rng.randint(1, max(1, max_tokens - 1))
    elif not req["stream"] and rng.random() < w.timeout_fraction:
        req["action"], req["cancel_after_s"] = "timeout", round(rng.uniform(0.2, 1.0), 3)
    return req


def build_requests(w: Workload) -> list[dict]:
    rng = random.Random(w.seed)
    ids_pre, word_pre = make_prefixes(w, rng)
    return [draw_request(w, rng, ids_pre, word_pre, i) for i in range(w.num_requests)]


# ---- metrics (pure) ---------------------------------------------------------------------
