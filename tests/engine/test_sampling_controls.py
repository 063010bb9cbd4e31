"""Sampling controls in the decode step, against references computed in the test from a plain
forward (engine.prompt_logits, float32): logprobs and top logprobs, logit_bias, OpenAI's
frequency / presence penalties, repetition penalty, min_tokens and min_p; each with
speculative decoding (n-gram drafts, accepted on repetitive prompts) off and on."""
from __future__ import annotations

import random

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams

TINY = dict(progress=False, dtype="float32", kv_cache_memory="4MiB", page_size=8,
            max_num_batched_tokens=24)
SPEC = dict(speculative="ngram", num_draft_tokens=4)


@pytest.fixture(scope="module")
def tiny_loaded():
    return loaded_from_hf(tiny_gemma3_hf())


@pytest.fixture(scope="module", params=["plain", "ngram"])
def llm(request, tiny_loaded):
    return LLM("tiny", loaded=tiny_loaded, **TINY, **(SPEC if request.param == "ngram" else {}))


def prompts(n, seed=0):
    """Short random patterns repeated: n-gram drafts get proposed and partly accepted."""
    rng = random.Random(seed)
    return [[2] + [rng.randrange(3, 512) for _ in range(rng.randint(2, 6))] * rng.randint(3, 6)
            for _ in range(n)]


def run(llm, ps, params):
    """Sequences after generating `ps` together (continuous batching)."""
    eng = llm.engine
    seqs = [eng.add_request(p, params) for p in ps]
    while any(s.finish_reason is None for s in seqs):
        eng.step()
    eng.check_integrity()
    return seqs


def raw_rows(llm, seq) -> torch.Tensor:
    """The target's logits at every output position [len(output), V], from one plain forward
    of prompt + output."""
    ids = seq.prompt_ids + seq.output_ids
    return llm.engine.prompt_logits(ids)[len(seq.prompt_ids) - 1:len(ids) - 1]


def reference_greedy(llm, prompt, params, steps) -> list[int]:
    """Greedy decoding with the processors written out here, one plain forward per token."""
    out: list[int] = []
    V = llm.engine.model_config.vocab_size
    for _ in range(steps):
        x = llm.engine.prompt_logits(prompt + out)[-1].clone()
        for t, b in params.logit_bias.items():
            x[t] += b
        if len(out) < params.min_tokens:
            for t in llm.engine.eos_ids:
                x[t] = float("-inf")
        if params.repetition_penalty != 1.0:
            for t in set(prompt + out):
                x[t] = x[t] / params.repetition_penalty if x[t] > 0 else x[t] * params.repetition_penalty
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=V).float() \
            if out else torch.zeros(V)
        x = x - counts * params.frequency_penalty - (counts > 0).float() * params.presence_penalty
        out.append(int(torch.argmax(x)))
    return out


def test_logprobs_are_the_log_softmax_of_a_plain_forward(llm):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=5)
    seqs = run(llm, prompts(5), params)
    for s in seqs:
        assert len(s.logprobs) == len(s.output_ids)
        want = torch.log_softmax(raw_rows(llm, s), dim=-1)
        for i, (lp, tok) in enumerate(zip(s.logprobs, s.output_ids)):
            assert lp.token == tok
            assert lp.logprob == pytest.approx(float(want[i, tok]), abs=1e-4)
            top_v, top_i = torch.topk(want[i], 5)
            assert [t for t, _ in lp.top][0] == int(top_i[0]) == tok     # greedy: the top one
            assert [v for _, v in lp.top] == pytest.approx(top_v.tolist(), abs=1e-4)
            assert {t for t, _ in lp.top} == set(top_i.tolist()) or \
                len(set(top_v.tolist())) < 5      # ties may order differently
    if llm.engine.spec is not None:        # drafts were verified, and accepted
        assert sum(sum(s.spec_stats.accepted) for s in seqs) > 0


def test_sampled_logprobs_match_too(llm):
    params = SamplingParams(temperature=0.8, top_k=50, max_tokens=20, ignore_eos=True, seed=3,
                            logprobs=0)
    for s in run(llm, prompts(4, seed=1), params):
        want = torch.log_softmax(raw_rows(llm, s), dim=-1)
        got = torch.tensor([lp.logprob for lp in s.logprobs])
        ref = want[torch.arange(len(s.output_ids)), torch.tensor(s.output_ids)]
        assert torch.allclose(got, ref, atol=1e-4)
        assert all(lp.top == () for lp in s.logprobs)


def test_logit_bias_minus_100_bans_the_greedy_tokens(llm):
    ps = prompts(3, seed=2)
    base = run(llm, ps, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    banned = {t for s in base for t in s.output_ids}
    again = run(llm, ps, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                        logit_bias={t: -100 for t in banned}))
    assert banned and not banned & {t for s in again for t in s.output_ids}
    # +100 forces a token, at every position
    forced = run(llm, ps, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=1,
                                         logit_bias={77: 100}))
    assert all(s.output_ids == [77] * 6 for s in forced)


@pytest.mark.parametrize("kw", [
    dict(frequency_penalty=1.5),
    dict(presence_penalty=2.0),
    dict(frequency_penalty=-0.7, presence_penalty=0.9),
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.6, frequency_penalty=0.5, logit_bias={5: 3.0, 9: -2.0}),
], ids=lambda kw: ",".join(kw))
def test_penalties_match_the_reference_sampler(llm, kw):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **kw)
    ps = prompts(3, seed=4)
    for p, s in zip(ps, run(llm, ps, params)):
        assert s.output_ids == reference_greedy(llm, p, params, 16)
    plain = run(llm, ps, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [s.output_ids for s in plain] != [reference_greedy(llm, p, params, 16) for p in ps]


def test_min_tokens_holds_back_eos(llm):
    eos = min(llm.engine.eos_ids)
    pushed = {eos: 100.0}           # EOS is the top token everywhere it is allowed
    ps = prompts(2, seed=5)
    early = run(llm, ps, SamplingParams(temperature=0, max_tokens=10, logit_bias=pushed))
    assert all(s.output_ids == [eos] for s in early)
    held = run(llm, ps, SamplingParams(temperature=0, max_tokens=10, min_tokens=4,
                                       logit_bias=pushed))
    for s in held:
        assert len(s.output_ids) == 5 and s.output_ids[-1] == eos and s.finish_reason == "stop"
        assert eos not in s.output_ids[:4]


def test_min_p_keeps_only_likely_tokens(llm):
    params = SamplingParams(temperature=1.0, min_p=0.3, max_tokens=20, ignore_eos=True, seed=7)
    for s in run(llm, prompts(4, seed=6), params):
        probs = torch.softmax(raw_rows(llm, s), dim=-1)
        for i, t in enumerate(s.output_ids):
            assert probs[i, t] >= 0.3 * probs[i].max() - 1e-6
