"""Speculative decoding is lossless under greedy decoding: with the n-gram drafter on, every
request's tokens equal those of plain decoding, token for token, on a tiny random Gemma 3
(window 8, page 8, chunked prefill: verify chunks and rollbacks cross window and page
boundaries), under batching with requests that stop at max_tokens, at a stop token or at
EOS in the middle of an accepted draft; and on the real default model copying its prompt."""
import dataclasses
import random

import pytest
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.spec import Drafter

TINY = dict(progress=False, dtype="float32", kv_cache_memory="4MiB", page_size=8,
            max_num_batched_tokens=24)


@pytest.fixture(scope="module")
def tiny_loaded():
    return loaded_from_hf(tiny_gemma3_hf())


def repetitive_prompts(n, seed=0):
    """A short random pattern repeated: drafts get accepted, and rejected where the random
    model's continuation drifts from the pattern."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pat = [rng.randrange(3, 512) for _ in range(rng.randint(2, 7))]
        out.append([2] + pat * rng.randint(2, 9))
    return out


def spy(llm):
    """Record, per verify step: (draft length, tokens the verifier produced, tokens kept)."""
    spec, log = llm.engine.spec, []
    execute, settle = spec.execute, spec.settle
    made = {}

    def ex(runner, head, chunks):
        toks = execute(runner, head, chunks)
        for c, t in zip([c for c in chunks if c.sample], toks):
            made[id(c)] = len(t)
        return toks

    def st(chunk, emitted):
        kept = settle(chunk, emitted)
        if id(chunk) in made and chunk.start >= len(chunk.seq.prompt_ids):
            log.append((len(chunk.draft), made.pop(id(chunk)), len(emitted)))
        return kept
    spec.execute, spec.settle = ex, st
    return log


def run_both(loaded, prompts, params, **opts):
    off = LLM("tiny", loaded=loaded, **TINY, **opts)
    on = LLM("tiny", loaded=loaded, speculative="ngram", num_draft_tokens=4, **TINY, **opts)
    log = spy(on)
    want = off.generate([{"prompt_token_ids": p} for p in prompts], params)
    got = on.generate([{"prompt_token_ids": p} for p in prompts], params)
    off.engine.check_integrity()
    on.engine.check_integrity()
    return want, got, log


def test_batch_of_eight_matches_plain_decoding(tiny_loaded):
    prompts = repetitive_prompts(8)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
              for m in (1, 2, 3, 5, 17, 40, 64, 90)]
    want, got, log = run_both(tiny_loaded, prompts, params)
    for w, g, p in zip(want, got, params):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == w.finish_reason == "length"
        assert len(g.token_ids) == p.max_tokens
    accepted = sum(made - 1 for _, made, _ in log)
    rejected = sum(d - (made - 1) for d, made, _ in log)
    assert accepted > 20 and rejected > 20, (accepted, rejected)
    assert any(d == 4 for d, _, _ in log)
    # Drafts are cut so a step never produces tokens past max_tokens.
    assert all(made == kept for _, made, kept in log)


class OracleDrafter(Drafter):
    """Proposes the plain run's own continuation, with every third draft's last token
    corrupted: full acceptances (so stops land inside accepted drafts) and rejections."""

    def __init__(self, prompts, outputs):
        self.ref = {tuple(p): o.token_ids for p, o in zip(prompts, outputs)}
        self.calls = 0

    def propose(self, seqs, k):
        out = []
        for s in seqs:
            n = len(s.output_ids)
            d = list(self.ref[tuple(s.prompt_ids)][n:n + k])
            self.calls += 1
            if d and self.calls % 3 == 0:
                d[-1] = (d[-1] + 1) % 512
            out.append(d)
        return out


def run_with_oracle(loaded, prompts, params):
    free = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    off = LLM("tiny", loaded=loaded, **TINY)
    ref = off.generate([{"prompt_token_ids": p} for p in prompts], free)
    want = off.generate([{"prompt_token_ids": p} for p in prompts], params)
    on = LLM("tiny", loaded=loaded, speculative="ngram", num_draft_tokens=4, **TINY)
    on.engine.spec.drafter = OracleDrafter(prompts, ref)
    log = spy(on)
    got = on.generate([{"prompt_token_ids": p} for p in prompts], params)
    off.engine.check_integrity()
    on.engine.check_integrity()
    return ref, want, got, log


def test_stop_tokens_mid_draft(tiny_loaded):
    prompts = repetitive_prompts(8, seed=1)
    ref = LLM("tiny", loaded=tiny_loaded, **TINY).generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    # Each request stops at the token its plain output emits first at some position >= 8
    # (one whose output is a single repeated token has none: it runs to max_tokens).
    params = []
    for i, o in enumerate(ref):
        new = [o.token_ids[j] for j in range(8 + i, 60) if o.token_ids[j] not in o.token_ids[:j]]
        params.append(SamplingParams(temperature=0, max_tokens=60, ignore_eos=True,
                                     stop_token_ids=new[:1]))
    _, want, got, log = run_with_oracle(tiny_loaded, prompts, params)
    assert sum(w.finish_reason == "stop" for w in want) >= 6
    for w, g in zip(want, got):
        assert (g.token_ids, g.finish_reason) == (w.token_ids, w.finish_reason)
    # Steps accepted drafts past their stop token: those were dropped, not emitted.
    assert sum(kept < made for _, made, kept in log) >= 3
    assert any(made < d + 1 for d, made, _ in log)      # and some drafts were rejected


def test_eos_mid_draft(tiny_loaded):
    prompts = repetitive_prompts(8, seed=2)
    ref = LLM("tiny", loaded=tiny_loaded, **TINY).generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    # Make EOS the token that ends the most requests well into their output (first emitted
    # at position >= 6), never earlier.
    counts = {}
    for o in ref:
        first = {}
        for j, t in enumerate(o.token_ids):
            first.setdefault(t, j)
        for t, j in first.items():
            counts[t] = counts.get(t, 0) + (1 if j >= 6 else -100)
    eos = max(counts, key=counts.get)
    assert counts[eos] >= 2
    loaded = dataclasses.replace(
        tiny_loaded, config=dataclasses.replace(tiny_loaded.config, eos_token_ids=(eos,)))
    _, want, got, log = run_with_oracle(loaded, prompts, SamplingParams(temperature=0,
                                                                        max_tokens=60))
    assert any(w.finish_reason == "stop" for w in want)
    for w, g in zip(want, got):
        assert (g.token_ids, g.finish_reason) == (w.token_ids, w.finish_reason)
    assert any(kept < made for _, made, kept in log)


def test_top_k_one_sampling_through_rejection_equals_greedy(tiny_loaded):
    """temperature 1, top-k 1: p is a point mass on the argmax, so the rejection-sampling
    path must give exactly the greedy tokens (a deterministic end-to-end check of it)."""
    prompts = repetitive_prompts(4, seed=3)
    want, _, _ = run_both(tiny_loaded, prompts,
                          SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    on = LLM("tiny", loaded=tiny_loaded, speculative="ngram", **TINY)
    got = on.generate([{"prompt_token_ids": p} for p in prompts],
                      SamplingParams(temperature=1.0, top_k=1, max_tokens=30, ignore_eos=True,
                                     seed=5))
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(g.spec_stats["accepted_tokens"] for g in got) > 10
    on.engine.check_integrity()


def test_sampling_with_speculation_is_reproducible_per_seed(tiny_loaded):
    on = LLM("tiny", loaded=tiny_loaded, speculative="ngram", **TINY)
    p = {"prompt_token_ids": repetitive_prompts(1, seed=4)[0]}
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=40, seed=11, ignore_eos=True)
    a, b = on.generate(p, params)[0], on.generate(p, params)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) == 40
    on.engine.check_integrity()


def test_default_model_copies_its_prompt_losslessly(gemma_loaded, gemma_fp32):
    from mimo.bench.spec import copy_prompts
    tok = gemma_fp32.tokenizer
    prompt = {"prompt_token_ids": tok.encode(copy_prompts(1)[0])}
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = gemma_fp32.generate(prompt, params)[0]
    on = LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, dtype="float32", quantize="none",
             kv_cache_memory="256MiB", speculative="ngram", num_draft_tokens=4)
    got = on.generate(prompt, params)[0]
    assert got.token_ids == want.token_ids
    assert "def dumps(obj" in got.text            # it really copies the code
    assert got.spec_stats["mean_acceptance_length"] > 2.5
    on.engine.check_integrity()


def test_speculation_with_prefix_cache_hits_is_lossless(tiny_loaded):
    """The same prompts twice, batched: the second round is served from the prefix cache
    (cached_tokens > 0) and speculation still gives exactly the tokens of plain decoding."""
    prompts = repetitive_prompts(6, seed=5)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    off = LLM("tiny", loaded=tiny_loaded, prefix_cache=False, **TINY)
    want = off.generate([{"prompt_token_ids": p} for p in prompts], params)
    # An SWA pool roomy enough that no retained window is evicted between the rounds.
    on = LLM("tiny", loaded=tiny_loaded, speculative="ngram", num_draft_tokens=4,
             swa_share=0.3, **TINY)
    for _ in range(2):
        got = on.generate([{"prompt_token_ids": p} for p in prompts], params)
        on.engine.check_integrity()
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert all(g.cached_tokens > 0 for g in got if len(g.prompt_token_ids) > 8)
    assert on.engine.spec.totals.emitted > on.engine.spec.totals.steps   # drafts were accepted
