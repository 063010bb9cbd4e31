"""Grammar-constrained decoding in the engine, on a tiny random model (fast): every output
under a JSON schema validates, greedy and sampled, under continuous batching; with n-gram
speculation greedy outputs equal plain decoding's token for token (drafts checked against
the grammar); the sparse and masked-greedy paths pick what masking the full logits picks."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from mimo import LLM, SamplingParams
from mimo.gpu.sampling import sparse_sample
from mimo.structured import Grammar, grammar_vocab

from .schemas import random_schemas


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from mimo.models.tiny import gemma3
    d = tmp_path_factory.mktemp("tiny_gemma3_grammar")
    gemma3.write(d, seed=1)
    return str(d)


def build(tiny_dir, **kw):
    return LLM(tiny_dir, progress=False, dtype="float32", kv_cache_memory="32MiB",
               max_num_seqs=64, **kw)


def generate(llm, schemas, temperature):
    eng = llm.engine
    vocab = grammar_vocab(llm.tokenizer, eng.model_config.vocab_size, eng.eos_ids)
    prompt = llm.tokenizer.encode("JSON:")
    seqs = [eng.add_request(prompt, SamplingParams(
        max_tokens=400, temperature=temperature, seed=i,
        constraint=Grammar.json_schema(s, vocab))) for i, s in enumerate(schemas)]
    while any(q.finish_reason is None for q in seqs):
        eng.step()
    eng.check_integrity()
    return seqs


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_outputs_validate_and_speculation_is_lossless(tiny_dir, temperature):
    schemas = random_schemas(24, seed=5)
    plain = generate(build(tiny_dir), schemas, temperature)
    spec_llm = build(tiny_dir, speculative="ngram", num_draft_tokens=4)
    spec = generate(spec_llm, schemas, temperature)
    for s, a, b in zip(schemas, plain, spec):
        for q in (a, b):
            assert q.finish_reason == "stop"
            jsonschema.validate(json.loads(spec_llm.tokenizer.decode(q.output_ids)), s)
        if temperature == 0:
            assert a.output_ids == b.output_ids
    assert sum(spec_llm.engine.spec.totals.drafted) > 0


def _heads(V=3000, H=32, seed=0):
    """A real LM head over a random weight, float32 and with its int8 copy."""
    from mimo.models.layers import Linear
    from mimo.models.lm_head import LMHead
    w = torch.randn(V, H, generator=torch.Generator().manual_seed(seed))
    q = Linear(w.clone())
    q.quantize_int8()
    return [LMHead(Linear(w)), LMHead(q)]


def _exact(head, h):
    lin = head.linear
    w = lin.weight if lin.w_int8 is None else lin.w_int8.float() * lin.w_scale.float()[:, None]
    return h.float() @ w.float().T


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_sparse_and_masked_greedy_match_full_masking(kind):
    head = _heads()[kind == "int8"]
    g = torch.Generator().manual_seed(1)
    greedy = SamplingParams(temperature=0)
    for _ in range(10):
        h = torch.randn(6, 32, generator=g) * 3
        frac = torch.tensor([0.001, 0.01, 0.1, 0.5, 0.9, 1.0])[:, None]
        masks = torch.rand(6, 3000, generator=g) < frac
        masks[:, 7] = True
        full = _exact(head, h).masked_fill(~masks, float("-inf")).argmax(-1).tolist()
        assert head.greedy(h, masks) == full
        assert [sparse_sample(head, h[i], masks[i], greedy, None) for i in range(3)] == full[:3]


def test_batched_masks_equal_each_matchers_own(tiny_dir):
    """One batch call over matchers at different points of different grammars gives each
    the mask it computes alone."""
    from mimo.structured.matcher import batch_allowed
    llm = build(tiny_dir)
    eng = llm.engine
    vocab = grammar_vocab(llm.tokenizer, eng.model_config.vocab_size, eng.eos_ids)
    schemas = random_schemas(6, seed=11)
    done = generate(llm, schemas, 0.9)
    matchers = []
    for s, q in zip(schemas, done):
        for cut in (0, len(q.output_ids) // 2, len(q.output_ids) - 1):
            m = Grammar.json_schema(s, vocab).matcher()
            assert m.consume(q.output_ids[:cut])
            matchers.append(m)
    rows = batch_allowed(matchers)
    assert rows.shape == (len(matchers), eng.model_config.vocab_size)
    for m, row in zip(matchers, rows):
        assert torch.equal(row, m.allowed())
    assert len({r.sum().item() for r in rows}) > 1     # the states differ


@pytest.mark.parametrize("spec", [None, "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_grammar_wins_over_min_tokens_and_ignore_eos(tiny_dir, temperature, spec):
    """A document that completes before min_tokens, or under ignore_eos, ends at the EOS its
    grammar allows: no row of banned-everything logits (which failed the whole batch), no
    tokens past the document; an unconstrained request in the same batch is unaffected."""
    kw = {"speculative": spec, "num_draft_tokens": 4} if spec else {}
    llm = build(tiny_dir, **kw)
    eng = llm.engine
    vocab = grammar_vocab(llm.tokenizer, eng.model_config.vocab_size, eng.eos_ids)
    prompt = llm.tokenizer.encode("JSON:")
    schema = {"type": "boolean"}
    seqs = [eng.add_request(prompt, SamplingParams(
        max_tokens=40, temperature=temperature, seed=i, constraint=Grammar.json_schema(
            schema, vocab), **opt)) for i, opt in enumerate(
        [{"min_tokens": 30}, {"ignore_eos": True}, {"min_tokens": 30, "ignore_eos": True}])]
    free = eng.add_request(prompt, SamplingParams(max_tokens=12, temperature=temperature,
                                                  min_tokens=12, seed=7))
    while any(q.finish_reason is None for q in seqs + [free]):
        eng.step()
    eng.check_integrity()
    for q in seqs:
        assert q.finish_reason == "stop"
        assert q.output_ids[-1] in eng.eos_ids
        assert json.loads(llm.tokenizer.decode(q.output_ids[:-1])) in (True, False)
    assert free.finish_reason == "length" and len(free.output_ids) == 12


def test_greedy_tokens_lie_in_the_mask_at_every_position(tiny_dir):
    """Greedy decoding under a grammar keeps the unconstrained argmax without computing the
    mask when the grammar takes it freely: replayed on a fresh matcher, every emitted token
    lies in the mask computed at its position (so it is the masked argmax)."""
    llm = build(tiny_dir)
    eng = llm.engine
    vocab = grammar_vocab(llm.tokenizer, eng.model_config.vocab_size, eng.eos_ids)
    schemas = random_schemas(24, seed=5) + random_schemas(40, seed=9)
    done = generate(llm, schemas, 0.0)
    for s, q in zip(schemas, done):
        m = Grammar.json_schema(s, vocab).matcher()
        for t in q.output_ids:
            if m.done:
                assert t in eng.eos_ids
                break
            assert bool(m.allowed()[t])
            assert m.consume([t])
