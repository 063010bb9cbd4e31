"""The mimo_v2_flash model on the dual pools against transformers' MiMoV2FlashForCausalLM (tiny
random config, float32), its SWA window semantics, the hub checkpoint's spelling of config and
weights, refusal of FP8 checkpoints, and the MTP layers (which transformers does not have)
against a plain forward written here from the checkpoint's weight layout."""
import dataclasses
import json

import pytest
import torch
from helpers.mtp_reference import mtp_weights, plain_mtp
from helpers.tiny_models import loaded_from_hf, tiny_mimo_v2_flash_hf

from mimo import LLM, SamplingParams
from mimo.config import ConfigError
from mimo.engine.scheduler import ScheduledChunk
from mimo.engine.sequence import Sequence
from mimo.models.hf_config import model_config_from_hf
from mimo.models.mimo_v2_flash import mtp_layers_in
from mimo.models.registry import LoadedModel

VOCAB = 300


@pytest.fixture(scope="module")
def hf_model():
    return tiny_mimo_v2_flash_hf()


@pytest.fixture(scope="module")
def llm(hf_model):
    llm = LLM("tiny", loaded=loaded_from_hf(hf_model), dtype="float32", kv_cache_memory="2MiB",
              page_size=4, max_num_batched_tokens=16, progress=False)
    yield llm
    llm.engine.check_integrity()


def _ids(n, seed):
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_config_maps_per_kind_shapes(llm):
    mc = llm.engine.model_config
    assert mc.layer_types == ("full", "swa", "swa", "full", "swa")
    assert mc.kv_shape("full") == (1, 24, 16) and mc.kv_shape("swa") == (2, 24, 16)
    assert (mc.rotary_dim, mc.swa_rotary_dim) == (int(24 * 0.334), 12)
    assert mc.swa_attention_sink and not mc.full_attention_sink
    assert mc.mlp_types == ("dense",) + ("sparse",) * 4
    pool = llm.engine.pool
    assert pool.full.k(0).shape[1:] == (1, 24) and pool.full.v(0).shape[1:] == (1, 16)
    assert pool.swa.k(0).shape[1:] == (2, 24) and pool.swa.v(0).shape[1:] == (2, 16)
    assert len(pool.full.layers) == 2 and len(pool.swa.layers) == 3


@pytest.mark.parametrize("n", [1, 6, 7, 8, 30])
def test_logits_match_transformers(hf_model, llm, n):
    ids = _ids(n, n)
    torch.testing.assert_close(llm.engine.prompt_logits(ids), _ref_logits(hf_model, ids),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 5, 8])
def test_chunked_prefill_matches_one_shot(hf_model, llm, chunk):
    """Chunks cross the 7-key window and the 4-token pages."""
    ids = _ids(29, 1)
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=chunk),
                               _ref_logits(hf_model, ids), atol=1e-4, rtol=0)


def test_greedy_decode_matches_one_shot_forward(hf_model, llm):
    prompts = [_ids(n, 100 + n) for n in (3, 12)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for p, out in zip(prompts, outs):
        ids = list(p)
        for _ in range(12):      # no cache: each token from a whole-sequence forward
            ids.append(int(_ref_logits(hf_model, ids)[-1].argmax()))
        assert out.token_ids == ids[len(p):]


def test_swa_window_is_sliding_window_size_previous_tokens_plus_the_query():
    """transformers 5.24 follows SGLang: sliding_window_size=6 lets a query see 6 previous
    tokens and itself (HF stores sliding_window=7), i.e. ModelConfig.sliding_window == 7. On a
    model whose only working layer is one SWA layer the last position's logits depend on token
    p-6 and not on p-7. (A full layer is needed for the pools; its outputs are zeroed.)"""
    model = tiny_mimo_v2_flash_hf(seed=5, num_hidden_layers=2, mlp_layer_types=["dense"] * 2,
                                  layer_types=["sliding_attention", "full_attention"])
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.zero_()
        model.model.layers[1].mlp.down_proj.weight.zero_()
    assert model.config.sliding_window == 7
    loaded = loaded_from_hf(model)
    assert loaded.config.sliding_window == 7
    llm = LLM("tiny", loaded=loaded, dtype="float32", kv_cache_memory="1MiB", page_size=4,
              progress=False)
    ids = _ids(20, 5)
    p = len(ids) - 1
    base = llm.engine.prompt_logits(ids)[-1]
    for back, seen in ((6, True), (7, False)):
        other = list(ids)
        other[p - back] = 3 if ids[p - back] != 3 else 4
        ours = llm.engine.prompt_logits(other)
        torch.testing.assert_close(ours, _ref_logits(model, other), atol=1e-4, rtol=0)
        assert (not torch.allclose(ours[-1], base, atol=1e-6)) == seen
    llm.engine.check_integrity()


def _hub_config(hf) -> dict:
    """The tiny model's config as the hub checkpoint spells MiMo-V2-Flash's."""
    c = hf.config
    rp = c.rope_parameters
    return {"model_type": "mimo_v2_flash", "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": 4,
            "num_key_value_heads": 1, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
            "head_dim": 24, "v_head_dim": 16, "swa_head_dim": 24, "swa_v_head_dim": 16,
            "hybrid_layer_pattern": [0, 1, 1, 0, 1], "moe_layer_freq": [0, 1, 1, 1, 1],
            "sliding_window_size": 6, "add_swa_attention_sink_bias": True,
            "add_full_attention_sink_bias": False, "attention_value_scale": 0.707,
            "rope_theta": rp["full_attention"]["rope_theta"],
            "swa_rope_theta": rp["sliding_attention"]["rope_theta"],
            "partial_rotary_factor": rp["full_attention"]["partial_rotary_factor"],
            "layernorm_epsilon": c.rms_norm_eps,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "n_group": 2, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "tie_word_embeddings": False,
            "max_position_embeddings": c.max_position_embeddings, "bos_token_id": 1,
            "eos_token_id": 2}


def _hub_weights(hf) -> dict:
    """transformers' state dict renamed to the hub checkpoint's layout: one module per expert,
    `attention_sink_bias` for transformers' `sinks`."""
    out = {}
    for k, v in hf.state_dict().items():
        v = v.detach().clone()
        if k.endswith("experts.gate_up_proj"):
            p = k[:-len("gate_up_proj")]
            for e, (g, u) in enumerate(zip(*v.chunk(2, dim=1))):
                out[f"{p}{e}.gate_proj.weight"], out[f"{p}{e}.up_proj.weight"] = g, u
        elif k.endswith("experts.down_proj"):
            p = k[:-len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e]
        else:
            out[k.replace("self_attn.sinks", "self_attn.attention_sink_bias")] = v
    return out


def test_hub_spelling_of_config_and_weights():
    """The hub config has one partial_rotary_factor for both kinds: a model to match."""
    rope = {kind: {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.334}
            for kind, theta in (("full_attention", 5e6), ("sliding_attention", 1e4))}
    model = tiny_mimo_v2_flash_hf(seed=2, rope_parameters=rope)
    hub = model_config_from_hf(_hub_config(model))
    assert hub == model_config_from_hf(model.config.to_dict())
    llm = LLM("tiny", loaded=LoadedModel(hub, _hub_weights(model), None, "hub"),
              dtype="float32", kv_cache_memory="2MiB", page_size=4, progress=False)
    ids = _ids(19, 7)
    torch.testing.assert_close(llm.engine.prompt_logits(ids, chunk=5),
                               _ref_logits(model, ids), atol=1e-4, rtol=0)


def test_fp8_checkpoint_is_refused_by_name(tmp_path, hf_model):
    """The released checkpoint is FP8 block-quantized; weights are read as plain floats here,
    so it must be refused before any is read, naming the format."""
    c = _hub_config(hf_model) | {"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="quantized.*fp8"):
        LLM(str(tmp_path), dtype="bfloat16", progress=False)


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_bfloat16_agrees_with_transformers_bfloat16(hf_model, quantize):
    """bf16 activations and KV (int8 weights for small row counts, which MoE experts see).
    This random model is rounding-sensitive (bf16 flips MoE routing: transformers' own bf16
    logits differ from its fp32 ones by > 1), so the check is on the predicted tokens."""
    import copy
    ref_model = copy.deepcopy(hf_model).to(torch.bfloat16)
    bf = LLM("tiny", loaded=loaded_from_hf(hf_model), dtype="bfloat16", quantize=quantize,
             kv_cache_memory="2MiB", page_size=4, progress=False)
    ids = _ids(17, 9)
    ours = bf.engine.prompt_logits(ids, chunk=4)
    assert ours.dtype == torch.float32 and torch.isfinite(ours).all()
    agree = (ours.argmax(-1) == _ref_logits(ref_model, ids).argmax(-1)).float().mean()
    assert agree >= 0.75
    out = bf.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=4,
                                                                ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    bf.engine.check_integrity()


# ---- MTP ----------------------------------------------------------------------------------

K = 2     # MTP layers in the test checkpoint


@pytest.fixture(scope="module")
def mtp_setup(hf_model):
    w = {k: v.detach().clone() for k, v in hf_model.state_dict().items()} | mtp_weights(hf_model, K)
    assert mtp_layers_in(w) == K
    cfg = dataclasses.replace(model_config_from_hf(hf_model.config.to_dict()), num_mtp_layers=K)
    llm = LLM("tiny", loaded=LoadedModel(cfg, w, None, "tiny"), dtype="float32",
              kv_cache_memory="2MiB", page_size=4, progress=False)
    yield w, llm
    llm.engine.check_integrity()


def test_mtp_layers_get_swa_pool_slots(mtp_setup):
    _, llm = mtp_setup
    pool = llm.engine.pool
    assert len(pool.swa.layers) == 3 + K and len(pool.full.layers) == 2
    assert len(llm.engine.runner.kv) == 5 + K
    mtp_kv = llm.engine.runner.kv[5]
    assert mtp_kv[0].data_ptr() == pool.swa.k(3).data_ptr()


@pytest.mark.parametrize("chunk", [None, 4])
def test_mtp_forward_matches_plain_forward(hf_model, mtp_setup, chunk):
    """Chain main model -> MTP 0 -> MTP 1 over a known sequence: row p of layer k combines the
    hidden state at p with token p + k + 1, prefilled chunk by chunk through the paged cache."""
    w, llm = mtp_setup
    eng = llm.engine
    ids = _ids(26, 11)
    M = len(ids) - K
    with torch.no_grad():
        refs = [hf_model.model(torch.tensor([ids])).last_hidden_state[0, :M]]
    for k in range(K):
        refs.append(plain_mtp(w, k, torch.tensor(ids[k + 1:k + 1 + M]), refs[-1], hf_model.config))
    seq = Sequence(-1, ids[:M], SamplingParams(max_tokens=1), eng.eos_ids)
    seq.kv = eng.pool.new_seq()
    outs = [[] for _ in range(K + 1)]
    chunk = chunk or M
    try:
        for start in range(0, M, chunk):
            n = min(chunk, M - start)
            eng.pool.grow(seq.kv, start + n)
            input_ids, positions, ctx, _, _ = eng.runner.prepare([ScheduledChunk(seq, start, n, True)],
                                                              all_logits=True)
            h = eng.model(input_ids, positions, ctx)
            outs[0].append(h)
            for k in range(K):
                toks = torch.tensor(ids[start + k + 1:start + k + 1 + n])
                h = eng.model.mtp_forward(k, toks, positions, h, ctx)
                outs[k + 1].append(h)
            eng.pool.release_window(seq.kv, start + n)
    finally:
        eng.pool.free_seq(seq.kv)
    for k in range(K + 1):
        torch.testing.assert_close(torch.cat(outs[k]), refs[k], atol=1e-4, rtol=0)
    # Draft logits come from the shared head.
    torch.testing.assert_close(eng.model.lm_head.logits(torch.cat(outs[K])),
                               refs[K] @ w["lm_head.weight"].T, atol=1e-4, rtol=0)


def test_model_with_mtp_layers_still_generates(hf_model, mtp_setup):
    _, llm = mtp_setup
    p = _ids(9, 12)
    out = llm.generate({"prompt_token_ids": p},
                       SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    ids = list(p)
    for _ in range(6):
        ids.append(int(_ref_logits(hf_model, ids)[-1].argmax()))
    assert out.token_ids == ids[len(p):]
