"""The gemma3 model on the paged cache against transformers' Gemma3ForCausalLM (tiny random
config, float32): same logits at every position, whatever the chunking."""
import pytest
import torch
from helpers.tiny_models import loaded_from_hf, tiny_gemma3_hf

from mimo import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny_pair(tiny_gemma3):
    llm = LLM("tiny", loaded=loaded_from_hf(tiny_gemma3), dtype="float32",
              kv_cache_memory="32MiB", page_size=4)
    yield tiny_gemma3, llm
    llm.engine.check_integrity()


def _ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("n", [1, 5, 8, 9, 40, 100])
def test_logits_match_transformers(tiny_pair, n):
    ref_model, llm = tiny_pair
    ids = torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    ours = llm.engine.prompt_logits(ids)
    ref = _ref_logits(ref_model, ids)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 7, 16])
def test_chunked_prefill_logits_match(tiny_pair, chunk):
    """Chunks cross the 8-token window and page boundaries (page 4)."""
    ref_model, llm = tiny_pair
    ids = torch.randint(3, 512, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = llm.engine.prompt_logits(ids, chunk=chunk)
    torch.testing.assert_close(ours, _ref_logits(ref_model, ids), atol=1e-4, rtol=0)


def test_greedy_decode_matches_transformers_generate(tiny_pair):
    ref_model, llm = tiny_pair
    ids = torch.randint(3, 512, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        ref = ref_model.generate(torch.tensor([ids]), max_new_tokens=30, do_sample=False,
                                 min_new_tokens=30, pad_token_id=0)[0, len(ids):].tolist()
    out = llm.generate({"prompt_token_ids": ids},
                       SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert out.token_ids == ref


def test_linear_rope_scaling_matches_transformers():
    """Gemma 3 4B+ scale the full layers' RoPE linearly; the local layers are unscaled."""
    model = tiny_gemma3_hf(seed=3, rope_scaling={"rope_type": "linear", "factor": 8.0})
    llm = LLM("tiny", loaded=loaded_from_hf(model), dtype="float32", kv_cache_memory="16MiB")
    assert llm.engine.model_config.rope_scaling_factor == 8.0
    ids = torch.randint(3, 512, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    torch.testing.assert_close(llm.engine.prompt_logits(ids), _ref_logits(model, ids),
                               atol=1e-4, rtol=0)
