"""A tiny random MiMo-V2-Flash checkpoint in the hub checkpoint's layout: one module per
expert (`mlp.experts.{e}.*_proj`), `self_attn.attention_sink_bias`, float32 router, and MTP
layers under `model.mtp.layers.{k}.` (which transformers ignores and mimo loads).

The config carries both spellings, consistent with each other: the hub's own keys
(hybrid_layer_pattern, swa_*, sliding_window_size, ...) and transformers' (layer_types,
rope_parameters, ...), so transformers 5.24's MiMoV2FlashForCausalLM loads it as it loads the
real model. Shape: 6 layers (full, 4 x SWA, full), like the real model's first block; SWA
layers have twice the full layers' KV heads (1 -> 2) and a sink logit per head; q/k head dim
24, v 16; RoPE on 8 of 24 dims; window 6 previous tokens + the query; a dense first layer,
then MoE with 8 experts in 2 groups, top-2; 2 MTP layers. ChatML special tokens.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ._common import Randn, byte_level_bpe, write_checkpoint

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PAD, IM_END = 0, 2
VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV, D, DV = 512, 64, 128, 6, 4, 1, 24, 16
EXPERTS, TOP_K, MOE_INTER, N_MTP, WINDOW_PREV = 8, 2, 32, 2, 6
PATTERN = [0, 1, 1, 1, 1, 0]          # 1: SWA
MOE = [0, 1, 1, 1, 1, 1]

CHATML = (
    "{%- for message in messages -%}\n"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}\n")


def config() -> dict:
    rope = {"rope_type": "default", "partial_rotary_factor": 0.334}
    return {
        "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
        "head_dim": D, "v_head_dim": DV, "hidden_act": "silu", "max_position_embeddings": 4096,
        "attention_bias": False, "attention_value_scale": 0.707, "tie_word_embeddings": False,
        "moe_intermediate_size": MOE_INTER, "n_routed_experts": EXPERTS,
        "num_experts_per_tok": TOP_K, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
        "routed_scaling_factor": None, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        # the hub checkpoint's spelling
        "hybrid_layer_pattern": PATTERN, "moe_layer_freq": MOE,
        "swa_num_attention_heads": HEADS, "swa_num_key_value_heads": 2 * KV,
        "swa_head_dim": D, "swa_v_head_dim": DV, "sliding_window_size": WINDOW_PREV,
        "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
        "rope_theta": 5_000_000.0, "swa_rope_theta": 10_000.0, "partial_rotary_factor": 0.334,
        "layernorm_epsilon": 1e-5, "num_nextn_predict_layers": N_MTP,
        # transformers' spelling of the same
        "layer_types": ["sliding_attention" if p else "full_attention" for p in PATTERN],
        "mlp_layer_types": ["sparse" if m else "dense" for m in MOE],
        "rope_parameters": {"full_attention": {**rope, "rope_theta": 5_000_000.0},
                            "sliding_attention": {**rope, "rope_theta": 10_000.0}},
        "rms_norm_eps": 1e-5, "sliding_window": WINDOW_PREV + 1,
        "bos_token_id": None, "eos_token_id": [IM_END, PAD], "pad_token_id": PAD,
        "dtype": "bfloat16"}


def _attention(r: Randn, p: str, swa: bool) -> dict:
    kv = 2 * KV if swa else KV
    w = {p + "self_attn.q_proj.weight": r(HEADS * D, HIDDEN),
         p + "self_attn.k_proj.weight": r(kv * D, HIDDEN),
         p + "self_attn.v_proj.weight": r(kv * DV, HIDDEN),
         p + "self_attn.o_proj.weight": r(HIDDEN, HEADS * DV)}
    if swa:
        w[p + "self_attn.attention_sink_bias"] = r(HEADS, std=1.0)
    return w


def _dense(r: Randn, p: str) -> dict:
    return {p + "gate_proj.weight": r(INTER, HIDDEN), p + "up_proj.weight": r(INTER, HIDDEN),
            p + "down_proj.weight": r(HIDDEN, INTER)}


def weights(seed: int) -> dict:
    r = Randn(seed)
    norm = lambda: r(HIDDEN, std=0.3, mean=1.0)     # noqa: E731  (x * w convention)
    w = {"model.embed_tokens.weight": r(VOCAB, HIDDEN, std=0.5), "model.norm.weight": norm(),
         "lm_head.weight": r(VOCAB, HIDDEN)}
    fp32 = set()
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= _attention(r, p, PATTERN[i] == 1)
        w |= {p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm()}
        if not MOE[i]:
            w |= _dense(r, p + "mlp.")
            continue
        w[p + "mlp.gate.weight"] = r(EXPERTS, HIDDEN, std=0.3)
        w[p + "mlp.gate.e_score_correction_bias"] = r(EXPERTS, std=0.1)
        fp32 |= {p + "mlp.gate.weight", p + "mlp.gate.e_score_correction_bias"}
        for e in range(EXPERTS):
            q = f"{p}mlp.experts.{e}."
            w |= {q + "gate_proj.weight": r(MOE_INTER, HIDDEN), q + "up_proj.weight": r(MOE_INTER, HIDDEN),
                  q + "down_proj.weight": r(HIDDEN, MOE_INTER)}
    for k in range(N_MTP):
        p = f"model.mtp.layers.{k}."
        w |= {p + "enorm.weight": norm(), p + "hnorm.weight": norm(),
              p + "eh_proj.weight": r(HIDDEN, 2 * HIDDEN), p + "input_layernorm.weight": norm(),
              p + "pre_mlp_layernorm.weight": norm(), p + "final_layernorm.weight": norm()}
        w |= _attention(r, p, swa=True) | _dense(r, p + "mlp.")
    # bf16 like the released bf16 weights; the router and its bias stay float32, as there.
    return {k: (v if k in fp32 else v.to(torch.bfloat16)) for k, v in w.items()}


def write(out_dir: Path, seed: int = 0) -> None:
    write_checkpoint(out_dir, config(), weights(seed), byte_level_bpe(SPECIAL, vocab_size=400),
                     {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                      "add_bos_token": False, "chat_template": CHATML},
                     {"eos_token_id": [IM_END, PAD], "pad_token_id": PAD})
