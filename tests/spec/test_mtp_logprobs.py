"""Logprobs under MTP speculative decoding, on a tiny random MiMo-V2-Flash with 2 MTP layers:
greedy `logprobs` / top alternatives with MTP drafting on equal those with speculation off,
and both equal the log-softmax of a plain (non-paged, whole-sequence) transformers forward of
the same tokens; batched, with drafts accepted, and again from the prefix cache. Read through
the offline API's `GenerationOutput.logprobs`."""
import dataclasses
import random

import pytest
import torch
from helpers.mtp_reference import mtp_weights
from helpers.tiny_models import tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.models.hf_config import model_config_from_hf
from mimo.models.registry import LoadedModel

K, TOP = 2, 5
OPTS = dict(dtype="float32", kv_cache_memory="4MiB", page_size=4, max_num_batched_tokens=12,
            progress=False)


@pytest.fixture(scope="module")
def hf_model():
    return tiny_mimo_v2_flash_hf()


def _head(hf, kind: str) -> torch.Tensor:
    w = hf.lm_head.weight.detach().clone()
    if kind == "random":
        return w
    # Two opposite rows dominate (target and MTP layers, which share the head, both answer
    # 7 or 9, so drafts are often accepted), plus small noise so no two logits tie and the
    # top alternatives are well defined.
    g = torch.Generator().manual_seed(11)
    out = torch.randn(w.shape, generator=g) * 0.004
    # "sharp": large enough to dominate a sampled draw too, so sampled drafts get accepted.
    scale = 20.0 if kind == "sharp" else 1.0
    out[7], out[9] = scale * w[7], -scale * w[7]
    return out


def _loaded(hf, head: torch.Tensor) -> LoadedModel:
    w = {k: v.detach().clone() for k, v in hf.state_dict().items()} | mtp_weights(hf, K)
    w["lm_head.weight"] = head
    cfg = dataclasses.replace(model_config_from_hf(hf.config.to_dict()), num_mtp_layers=K)
    return LoadedModel(cfg, w, None, "tiny")


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(10)]
    return [(shared if i % 2 else []) + [rng.randrange(3, 300) for _ in range(rng.randint(2, 25))]
            for i in range(5)]


def _reference(hf, head, prompt: list[int], out: list[int]) -> torch.Tensor:
    """log-softmax over the output positions of one plain forward of prompt + output."""
    ids = prompt + out
    with torch.no_grad():
        h = hf.model(torch.tensor([ids])).last_hidden_state[0]
    logits = h[len(prompt) - 1:len(ids) - 1] @ head.T
    return torch.log_softmax(logits.float(), dim=-1)


def _check_against_reference(lps, ref: torch.Tensor, out: list[int], greedy=True) -> None:
    assert [x.token for x in lps] == out
    for i, x in enumerate(lps):
        assert x.logprob == pytest.approx(float(ref[i, x.token]), abs=1e-4)
        # The true top-k: the reported values are the k largest, each that of its token.
        want = torch.topk(ref[i], TOP).values.tolist()
        assert [v for _, v in x.top] == pytest.approx(want, abs=1e-4)
        for t, v in x.top:
            assert v == pytest.approx(float(ref[i, t]), abs=1e-4)
        if greedy:
            assert x.top[0][0] == x.token        # greedy picks the top one


@pytest.mark.parametrize("head_kind", ["random", "two_rows"])
def test_mtp_logprobs_equal_plain_decoding_and_a_plain_forward(hf_model, head_kind):
    head = _head(hf_model, head_kind)
    loaded = _loaded(hf_model, head)
    off = LLM("tiny", loaded=loaded, **OPTS)
    on = LLM("tiny", loaded=loaded, speculative="mtp", num_draft_tokens=K, **OPTS)
    prompts = [{"prompt_token_ids": p} for p in _prompts(4)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, logprobs=TOP)
              for m in (3, 9, 17, 24, 30)]
    for round_ in range(2):            # the second round is served from the prefix cache
        want = off.generate(prompts, params)
        got = on.generate(prompts, params)
        for p, w, g in zip(prompts, want, got):
            assert g.token_ids == w.token_ids
            assert len(g.logprobs) == len(g.token_ids) == len(w.logprobs)
            for a, b in zip(g.logprobs, w.logprobs):
                assert a.token == b.token
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
                assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4)
            _check_against_reference(g.logprobs, _reference(hf_model, head,
                                                            p["prompt_token_ids"], g.token_ids),
                                     g.token_ids)
        if round_:
            assert sum(g.cached_tokens > 0 for g in got) >= 2
    t = on.engine.spec.totals
    assert sum(t.drafted) > 40
    if head_kind == "two_rows":
        # Verify steps that keep drafts really happen: the logprobs of accepted drafts come
        # from the verify forward's later rows.
        assert t.accepted[0] >= 10 and t.accepted[1] >= 3, (t.drafted, t.accepted)


def test_sampled_mtp_logprobs_are_the_targets(hf_model):
    """Sampled requests verify MTP drafts by rejection sampling: the reported logprobs are
    still the target's raw distribution at each emitted token (a plain forward's), accepted
    drafts included."""
    head = _head(hf_model, "sharp")
    on = LLM("tiny", loaded=_loaded(hf_model, head), speculative="mtp", num_draft_tokens=K,
             **OPTS)
    prompts = [{"prompt_token_ids": p} for p in _prompts(8)]
    params = [SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=i,
                             logprobs=TOP) for i in range(len(prompts))]
    for p, g in zip(prompts, on.generate(prompts, params)):
        _check_against_reference(g.logprobs, _reference(hf_model, head, p["prompt_token_ids"],
                                                        g.token_ids), g.token_ids, greedy=False)
    assert sum(on.engine.spec.totals.accepted) >= 10


def test_logprobs_off_leaves_the_field_empty(hf_model):
    llm = LLM("tiny", loaded=_loaded(hf_model, _head(hf_model, "random")), speculative="mtp",
              **OPTS)
    out = llm.generate({"prompt_token_ids": [5, 6, 7, 8]},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert out.logprobs is None and len(out.token_ids) == 4
    zero = llm.generate({"prompt_token_ids": [5, 6, 7, 8]},
                        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                       logprobs=0))[0]
    assert zero.token_ids == out.token_ids
    assert [x.top for x in zero.logprobs] == [()] * 4
