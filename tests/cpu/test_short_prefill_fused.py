"""A step of at most 16 rows runs on the fused decode layers even when it prefills: the runner
gives each token its own one-query row (as verify chunks), all rows' K/V written before
attention. Greedy tokens stay those of the plain layers."""
import pytest
from helpers.tiny_models import loaded_from_hf, random_prompts, tiny_gemma3_hf

from mimo import LLM, SamplingParams
from mimo.cpu import decode_ops
from mimo.models import fused_decode

pytestmark = pytest.mark.skipif(decode_ops.load() is None, reason="no CPU kernel build on this machine")


def _engine(fused: str) -> LLM:
    return LLM("tiny", loaded=loaded_from_hf(tiny_gemma3_hf(seed=7)), dtype="float32",
               quantize="q8_0", fused_decode=fused, kv_cache_memory="4MiB", progress=False)


def test_short_prefill_takes_the_fused_layers(monkeypatch):
    llm = _engine("auto")
    layers = llm.engine.weights.fused_layers
    assert layers == 6
    rows = []
    orig = fused_decode.run

    def spy(fused, x, *rest):
        rows.append(x.shape[0])
        return orig(fused, x, *rest)
    monkeypatch.setattr(fused_decode, "run", spy)
    one = SamplingParams(temperature=0, max_tokens=1)
    short, long = random_prompts(3, [11, 40], vocab=500)
    llm.generate([{"prompt_token_ids": short}], one)
    assert rows == [11] * layers           # the prefill step: every layer, all 11 rows
    rows.clear()
    llm.generate([{"prompt_token_ids": long}], one)
    assert rows == []                      # 40 rows: the plain layers


def test_short_prefill_tokens_equal_the_plain_layers():
    prompts = [{"prompt_token_ids": p} for p in random_prompts(5, [1, 6, 16, 17], vocab=500)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    fused, plain = _engine("auto"), _engine("off")
    for p in prompts:          # one at a time: each prefill is its own step of <= 17 rows
        assert fused.generate([p], params)[0].token_ids == plain.generate([p], params)[0].token_ids
