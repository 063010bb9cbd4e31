"""The offline API: prompts as text or token ids, seeds, stop tokens, outputs."""
import pytest
from helpers.tiny_models import loaded_from_hf

from mimo import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_gemma3):
    llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3), dtype="float32", kv_cache_memory="8MiB")
    yield llm
    llm.engine.check_integrity()


IDS = [2, 17, 99, 301, 45, 8, 77]


def test_one_output_per_prompt_in_order(llm):
    prompts = [{"prompt_token_ids": IDS[:k]} for k in (3, 7, 5)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == [p["prompt_token_ids"] for p in prompts]
    assert all(len(o.token_ids) == 6 and o.finish_reason == "length" for o in outs)
    assert all(o.cached_tokens == 0 for o in outs)


def test_seed_reproduces_and_differs(llm):
    p = {"prompt_token_ids": IDS}
    a = llm.generate(p, SamplingParams(temperature=1.0, max_tokens=20, seed=1, ignore_eos=True))[0]
    b = llm.generate(p, SamplingParams(temperature=1.0, max_tokens=20, seed=1, ignore_eos=True))[0]
    c = llm.generate(p, SamplingParams(temperature=1.0, max_tokens=20, seed=2, ignore_eos=True))[0]
    assert a.token_ids == b.token_ids != c.token_ids


def test_top_k_one_is_greedy(llm):
    p = {"prompt_token_ids": IDS}
    g = llm.generate(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    k = llm.generate(p, SamplingParams(temperature=0.8, top_k=1, max_tokens=10, seed=3,
                                       ignore_eos=True))[0]
    assert g.token_ids == k.token_ids


def test_stop_token_ids_end_generation_and_are_kept(llm):
    p = {"prompt_token_ids": IDS}
    free = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[4]
    first = free.index(stop)
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                         stop_token_ids=[stop]))[0]
    assert out.token_ids == free[:first + 1] and out.finish_reason == "stop"


def test_eos_ends_generation_unless_ignored(llm):
    # Make EOS (id 1) the argmax by asking for it as the continuation of itself: find a prompt
    # whose greedy continuation contains EOS, using ignore_eos to look ahead.
    p = {"prompt_token_ids": IDS}
    free = llm.generate(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=12))[0]
    if 1 in free:
        assert out.token_ids == free[:free.index(1) + 1] and out.finish_reason == "stop"
    else:
        assert out.token_ids == free and out.finish_reason == "length"


def test_text_prompts_with_real_tokenizer(gemma_fp32):
    out = gemma_fp32.generate("The capital of France is",
                              SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.prompt_token_ids[0] == gemma_fp32.tokenizer.bos_token_id
    assert "Paris" in out.text or "capital" in out.text
    assert out.text == gemma_fp32.tokenizer.decode(out.token_ids)
