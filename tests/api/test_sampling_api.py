"""Sampling controls through the official openai client against real servers (float32),
checked against the offline engine: logprobs equal the log-softmax of a plain forward of the
same tokens, speculation (n-gram) off and on, and top_logprobs are the true top-k; a
logit_bias of -100 bans its tokens; n=4 with a seed gives four reproducible samples that
share the prompt through the prefix cache; best_of keeps the likeliest; echo."""
from __future__ import annotations

import pytest
import torch

from mimo import SamplingParams
from mimo.models.chat_template import ChatTemplate

MODEL = "gemma-3-270m"
# Repetitive, so n-gram drafts are proposed and accepted.
PROMPT = "one two three four, one two three four, one two three four, one two"


@pytest.fixture(params=["plain", "ngram"])
def any_client(request, client, spec_client):
    return client if request.param == "plain" else spec_client


def reference(llm, ids, out):
    """log-softmax of one plain forward of prompt + output, at the output positions."""
    logits = llm.engine.prompt_logits(ids + out)[len(ids) - 1:len(ids) + len(out) - 1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_completion_logprobs_equal_a_plain_forward(any_client, gemma_fp32):
    ids = gemma_fp32.tokenizer.encode(PROMPT)
    out = gemma_fp32.generate({"prompt_token_ids": ids},
                              SamplingParams(temperature=0, max_tokens=16))[0].token_ids
    r = any_client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0,
                                      logprobs=5)
    lp = r.choices[0].logprobs
    tok = gemma_fp32.tokenizer
    assert lp.tokens == [tok.decode([t], skip_special_tokens=False) for t in out]
    want = reference(gemma_fp32, ids, out)
    for i, t in enumerate(out):
        assert lp.token_logprobs[i] == pytest.approx(float(want[i, t]), abs=2e-3)
        v, ix = torch.topk(want[i], 5)
        got = lp.top_logprobs[i]
        assert sorted(got.values(), reverse=True) == pytest.approx(v.tolist(), abs=2e-3)
        assert set(got) == {tok.decode([j], skip_special_tokens=False) for j in ix.tolist()}


def test_chat_logprobs_and_top_logprobs(any_client, gemma_fp32):
    msgs = [{"role": "user", "content": PROMPT}]
    r = any_client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=3)
    tpl = ChatTemplate.for_model(gemma_fp32.tokenizer, "gemma3")
    ids = tpl.encode(gemma_fp32.tokenizer, msgs)
    out = gemma_fp32.generate({"prompt_token_ids": ids},
                              SamplingParams(temperature=0, max_tokens=12))[0].token_ids
    want = reference(gemma_fp32, ids, out)
    content = r.choices[0].logprobs.content
    assert len(content) == len(out)
    for i, (c, t) in enumerate(zip(content, out)):
        assert c.logprob == pytest.approx(float(want[i, t]), abs=2e-3)
        assert [x.logprob for x in c.top_logprobs] == pytest.approx(
            torch.topk(want[i], 3).values.tolist(), abs=2e-3)
        assert c.top_logprobs[0].token == c.token     # greedy picks the top one
        assert bytes(c.bytes) == c.token.encode()


def test_sampled_logprobs_are_of_the_sampled_tokens(client, gemma_fp32):
    ids = gemma_fp32.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.9, max_tokens=12, seed=11)
    out = gemma_fp32.generate({"prompt_token_ids": ids}, params)[0].token_ids
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0.9,
                                  seed=11, logprobs=0)
    want = reference(gemma_fp32, ids, out)
    got = r.choices[0].logprobs.token_logprobs
    assert got == pytest.approx([float(want[i, t]) for i, t in enumerate(out)], abs=2e-3)


def test_logit_bias_minus_100_bans_the_greedy_tokens(any_client, gemma_fp32):
    ids = gemma_fp32.tokenizer.encode(PROMPT)
    out = gemma_fp32.generate({"prompt_token_ids": ids},
                              SamplingParams(temperature=0, max_tokens=8))[0].token_ids
    base = any_client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                         logprobs=0)
    tok = gemma_fp32.tokenizer
    assert base.choices[0].logprobs.tokens == [tok.decode([t]) for t in out]
    again = any_client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                          logprobs=0, logit_bias={str(t): -100 for t in out})
    assert not {tok.decode([t]) for t in out} & set(again.choices[0].logprobs.tokens)


def test_n4_with_a_seed_is_reproducible_and_shares_the_prompt(client):
    prompt = ("A hybrid sliding-window model keeps full attention in a few layers and a short "
              "window in the others. ") * 2
    kw = dict(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0, seed=1234, n=4)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    texts = [c.text for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2, 3]
    assert texts == [c.text for c in b.choices]
    assert len(set(texts)) > 1                       # four samples, not one repeated
    # samples 1..3 start after sample 0's prefill and reuse its prompt KV (whole pages)
    assert a.usage.prompt_tokens_details.cached_tokens >= (a.usage.prompt_tokens - 1) // 16 * 16
    assert a.usage.completion_tokens == 40
    # each choice alone is sample i of that seed: choice 2 == n=1 with seed + 2
    one = client.completions.create(**{**kw, "n": 1, "seed": 1236})
    assert one.choices[0].text == texts[2]


def test_best_of_keeps_the_likeliest(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7)
    every = client.completions.create(**kw, n=4, logprobs=0)
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)
             for c in every.choices]
    best = client.completions.create(**kw, n=1, best_of=4)
    assert best.choices[0].text == every.choices[max(range(4), key=means.__getitem__)].text
    assert best.choices[0].logprobs is None


def test_echo_prepends_the_prompt(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                  echo=True)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True))
    assert streamed == r.choices[0].text


def test_penalties_and_min_tokens_are_applied(client, gemma_fp32):
    kw = dict(model=MODEL, prompt="Once upon a time, in a land far away,", max_tokens=24,
              temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    assert client.completions.create(**kw, frequency_penalty=2.0).choices[0].text != plain
    assert client.completions.create(**kw, presence_penalty=2.0).choices[0].text != plain
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                  extra_body={"min_tokens": 6})
    assert r.usage.completion_tokens == 6
    n = len(gemma_fp32.tokenizer.encode(PROMPT))
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (n, n + 6)
