"""The score in `policy.choose`, against a plain restatement of the report's formula: which
worker wins a request whose history one worker holds, whether or not the request continues
an earlier one there, and the continuation weight's reach (only where the request
continues; raising it never moves a request off the worker it continues)."""
from __future__ import annotations

import random

import pytest

from mimo.config import ConfigError
from mimo.router.config import RouterConfig, build_parser, router_config
from mimo.router.policy import Candidate, choose

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def test_a_continuation_follows_its_history_onto_a_busier_worker():
    # A holds 540 of the prompt's 600 tokens and has 3 requests in flight; B and C hold the
    # first page only and are idle: mean load 1, so A's load weighs 3 / 2 against it.
    def cands(continues: bool):
        return [Candidate(A, 540, 3.0, continues), Candidate(B, 16, 0.0),
                Candidate(C, 16, 0.0)]
    # Continuing an earlier request on A: 2 x 0.9 - 1.5 beats 0.027.
    assert choose(cands(True), 600, 1.0, b"t", continuation_weight=2.0).url == A
    # The same fraction merely shared (a system prompt): copied to an idle worker.
    assert choose(cands(False), 600, 1.0, b"t", continuation_weight=2.0).url != A
    # Weight 1 is the plain formula: the load wins.
    assert choose(cands(True), 600, 1.0, b"t", continuation_weight=1.0).url != A


def _plain(cands, prompt_len, mw, cw):
    """The report's score restated: mw (x cw where the request continues) x fraction -
    load / (mean load + 1); the highest wins, ties to the lower load (the workers left)."""
    mean = sum(c.load for c in cands) / len(cands)
    scored = [((mw * (cw if c.continues else 1.0)) * c.predicted / prompt_len
               - c.load / (mean + 1.0), c) for c in cands]
    top = max(round(s, 9) for s, _ in scored)
    best = [c for s, c in scored if round(s, 9) == top]
    low = min(c.load for c in best)
    return [c.url for c in best if c.load == low], top


def _random_cands(rnd: random.Random, prompt_len: int, continues_p: float):
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(rnd.randint(1, 6))]
    return [Candidate(u, float(rnd.choice([0, 16, rnd.randint(0, prompt_len)])),
                      float(rnd.choice([0, 1, 2, rnd.randint(0, 12)]))
                      + rnd.choice([0.0, rnd.random()]),
                      rnd.random() < continues_p) for u in urls]


def test_choose_agrees_with_the_plain_formula_on_random_candidates():
    rnd = random.Random(7)
    for _ in range(3000):
        n = rnd.randint(1, 4000)
        cands = _random_cands(rnd, n, 0.3)
        mw, cw = rnd.choice([1.0, 0.5, 2.0]), rnd.choice([1.0, 2.0, 3.5])
        got = choose(cands, n, mw, b"x%d" % n, cw)
        urls, top = _plain(cands, n, mw, cw)
        assert got.url in urls, (cands, got)
        assert round(got.score, 9) == top


def test_the_continuation_weight_reaches_only_requests_that_continue():
    rnd = random.Random(11)
    moved_to_continued = 0
    for i in range(3000):
        n = rnd.randint(1, 4000)
        plain = _random_cands(rnd, n, 0.0)
        tie = b"k%d" % i
        # Nothing continues: the weight changes nothing.
        assert choose(plain, n, 1.0, tie, 4.0) == choose(plain, n, 1.0, tie, 1.0)
        # One worker continues the request: a higher weight keeps a choice of it, and can
        # only move the request onto it.
        k = rnd.randrange(len(plain))
        cands = [Candidate(c.url, c.predicted, c.load, j == k) for j, c in enumerate(plain)]
        before = choose(cands, n, 1.0, tie, 1.0).url
        after = choose(cands, n, 1.0, tie, 3.0).url
        if before == cands[k].url:
            assert after == before
        elif after != before:
            assert after == cands[k].url
            moved_to_continued += 1
    assert moved_to_continued > 50       # the draws do exercise the weight


def test_weights_are_validated_and_the_flag_is_parsed():
    with pytest.raises(ConfigError, match="continuation_weight"):
        RouterConfig(continuation_weight=-1.0)
    with pytest.raises(ConfigError, match="match_weight"):
        RouterConfig(match_weight=-0.5)
    a = build_parser().parse_args(["--worker", A, "--continuation-weight", "3"])
    assert router_config(a).continuation_weight == 3.0
    assert router_config(build_parser().parse_args([])).continuation_weight == 2.0
