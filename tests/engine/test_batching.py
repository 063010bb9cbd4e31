"""Continuous batching and chunked prefill on the real default model (float32): the tokens of
a request do not depend on how its prompt was chunked or what it was batched with."""
import pytest
from helpers.tiny_models import long_prompt_ids

from mimo import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(gemma_fp32):
    tok = gemma_fp32.tokenizer
    texts = ["The capital of France is", "def quicksort(xs):", "Water boils at",
             "My favourite poem begins", "Rain in Spain", "import os\nimport sys\n",
             "The mitochondria is", "Once upon a time"]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def solo(gemma_fp32, prompts):
    """Each prompt alone, prefilled in one chunk."""
    return [gemma_fp32.generate({"prompt_token_ids": p}, GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize("chunk", [1, 7, 64, 512])
def test_chunk_size_does_not_change_tokens(gemma_loaded, gemma_fp32, chunk):
    # 600 tokens: past the 512-token window, so chunks straddle the window edge too.
    ids = long_prompt_ids(gemma_fp32.tokenizer, 600)
    want = gemma_fp32.generate({"prompt_token_ids": ids}, GREEDY)[0].token_ids
    llm = LLM("gemma-3-270m", progress=False, loaded=gemma_loaded, dtype="float32", quantize="none",
              kv_cache_memory="128MiB", max_num_batched_tokens=chunk)
    got = llm.generate({"prompt_token_ids": ids}, GREEDY)[0].token_ids
    assert got == want
    llm.engine.check_integrity()


def test_eight_requests_in_one_batch(gemma_fp32, prompts, solo):
    eng = gemma_fp32.engine
    seqs = [eng.add_request(p, GREEDY) for p in prompts]
    widest = 0
    while eng.has_work():
        chunks = eng.scheduler.running
        eng.step()
        widest = max(widest, len(chunks))
    assert widest == 8
    assert [s.output_ids for s in seqs] == solo


def test_new_requests_join_running_ones(gemma_fp32, prompts, solo):
    eng = gemma_fp32.engine
    first = eng.add_request(prompts[0], GREEDY)
    for _ in range(4):
        eng.step()
    assert 0 < len(first.output_ids) < GREEDY.max_tokens
    late = eng.add_request(prompts[1], GREEDY)
    shared_steps = 0
    while eng.has_work():
        if first in eng.scheduler.running and late in eng.scheduler.running:
            shared_steps += 1
        eng.step()
    assert shared_steps > 0
    assert first.output_ids == solo[0] and late.output_ids == solo[1]
