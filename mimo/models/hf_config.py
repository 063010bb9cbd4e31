"""Hugging Face config.json -> ModelConfig, per architecture."""
from __future__ import annotations

from typing import Any

from ..config import ConfigError, ModelConfig


def _eos_ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v),)


def gemma3_config(c: dict[str, Any]) -> ModelConfig:
    if "text_config" in c:          # Gemma3ForConditionalGeneration wraps the text model
        c = {**c["text_config"], "eos_token_id": c.get("eos_token_id", c["text_config"].get("eos_token_id"))}
    n = c["num_hidden_layers"]
    if c.get("layer_types"):
        types = tuple("full" if t == "full_attention" else "swa" for t in c["layer_types"])
    else:
        pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
        types = tuple("full" if (i + 1) % pattern == 0 else "swa" for i in range(n))
    rp = c.get("rope_parameters") or {}
    theta = rp.get("full_attention", {}).get("rope_theta", c.get("rope_theta", 1_000_000.0))
    local = rp.get("sliding_attention", {}).get("rope_theta", c.get("rope_local_base_freq", 10_000.0))
    scaling = rp.get("full_attention", {}) if rp else (c.get("rope_scaling") or {})
    factor = float(scaling.get("factor", 1.0)) if scaling.get("rope_type", "default") == "linear" else 1.0
    if c.get("attn_logit_softcapping") or c.get("final_logit_softcapping"):
        raise ConfigError("gemma3 with logit soft-capping is not supported")
    hd = c.get("head_dim", 256)
    kv = c.get("num_key_value_heads", 1)
    return ModelConfig(
        arch="gemma3", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_layers=n,
        num_heads=c["num_attention_heads"], layer_types=types, full_kv_heads=kv, swa_kv_heads=kv,
        head_dim=hd, v_head_dim=hd, swa_head_dim=hd, swa_v_head_dim=hd,
        sliding_window=c.get("sliding_window", 512), rope_theta=theta, rope_local_theta=local,
        rms_norm_eps=c.get("rms_norm_eps", 1e-6),
        max_position=c.get("max_position_embeddings", 32768),
        query_pre_attn_scalar=c.get("query_pre_attn_scalar", hd),
        tie_word_embeddings=c.get("tie_word_embeddings", True),
        bos_token_id=c.get("bos_token_id"), eos_token_ids=_eos_ids(c.get("eos_token_id")),
        rope_scaling_factor=factor)


def llama_config(c: dict[str, Any]) -> ModelConfig:
    """Llama (and models saved as model_type 'llama', e.g. SmolLM2): full attention on every
    layer, GQA, SiLU MLP, plain RMSNorm (x * w), RoPE, no embedding scale."""
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise ConfigError("llama with attention_bias/mlp_bias is not supported")
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"llama with hidden_act={act!r} is not supported (only silu)")
    # transformers 5 keeps theta and scaling in rope_parameters; older configs in
    # rope_theta + rope_scaling (whose type key was once 'type').
    rp = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = float(rp.get("rope_theta", c.get("rope_theta", 10_000.0)))
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type == "default":
        factor = 1.0
    elif rope_type == "linear":
        factor = float(rp["factor"])
    else:
        raise ConfigError(f"llama RoPE scaling {rope_type!r} is not supported "
                          f"(supported: default, linear)")
    if float(c.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError("llama with partial_rotary_factor != 1 is not supported")
    heads = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // heads
    kv = c.get("num_key_value_heads") or heads
    max_pos = c.get("max_position_embeddings", 2048)
    return ModelConfig(
        arch="llama", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_layers=c["num_hidden_layers"],
        num_heads=heads, layer_types=("full",) * c["num_hidden_layers"],
        full_kv_heads=kv, swa_kv_heads=kv, head_dim=hd, v_head_dim=hd, swa_head_dim=hd,
        swa_v_head_dim=hd,
        # No SWA layer: the window is never used; the whole context keeps it harmless.
        sliding_window=max_pos, rope_theta=theta, rope_local_theta=theta,
        rms_norm_eps=c.get("rms_norm_eps", 1e-6), max_position=max_pos,
        query_pre_attn_scalar=None,
        # LlamaConfig defaults to an untied head, unlike Gemma.
        tie_word_embeddings=c.get("tie_word_embeddings", False),
        bos_token_id=c.get("bos_token_id"), eos_token_ids=_eos_ids(c.get("eos_token_id")),
        rope_scaling_factor=factor)


HF_CONFIGS = {"gemma3": gemma3_config, "gemma3_text": gemma3_config, "llama": llama_config}


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    mt = c.get("model_type")
    if mt not in HF_CONFIGS:
        raise ConfigError(f"unsupported model_type {mt!r}; supported: {', '.join(sorted(HF_CONFIGS))}")
    return HF_CONFIGS[mt](c)
