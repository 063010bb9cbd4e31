"""Hugging Face config.json -> ModelConfig, per architecture."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..config import ConfigError, ModelConfig, VisionConfig


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


def _mimo_rope(c: dict[str, Any], kind: str) -> tuple[float, float]:
    """(theta, partial_rotary_factor) of a layer kind. transformers 5 keeps them per kind in
    rope_parameters; the hub checkpoint's own config has rope_theta / swa_rope_theta and one
    partial_rotary_factor. Defaults are transformers' (the released model's values)."""
    rp = c.get("rope_parameters") or {}
    hf_kind = "full_attention" if kind == "full" else "sliding_attention"
    if hf_kind in rp:
        p = rp[hf_kind]
        if p.get("rope_type", "default") != "default":
            raise ConfigError(f"mimo_v2_flash RoPE type {p.get('rope_type')!r} is not supported")
        return float(p["rope_theta"]), float(p.get("partial_rotary_factor", 0.334))
    if c.get("rope_scaling"):
        raise ConfigError("mimo_v2_flash with rope_scaling is not supported")
    full = float(c.get("rope_theta", 5_000_000.0))
    theta = full if kind == "full" else float(c.get("swa_rope_theta", 10_000.0))
    return theta, float(c.get("partial_rotary_factor", 0.334))


def mimo_v2_flash_config(c: dict[str, Any]) -> ModelConfig:
    """MiMo-V2-Flash, from either spelling of its config: transformers' (layer_types,
    mlp_layer_types, rope_parameters, sliding_window; SWA KV heads are twice the full ones) or
    the hub checkpoint's own (hybrid_layer_pattern, moe_layer_freq, swa_* keys,
    sliding_window_size, add_*_attention_sink_bias, layernorm_epsilon).

    Window: SGLang (the reference implementation) lets an SWA query see `sliding_window_size`
    previous tokens plus itself; transformers 5.24 stores that as sliding_window =
    sliding_window_size + 1 and masks keys in (pos - sliding_window, pos]. ModelConfig counts
    the same way, so: sliding_window_size + 1 when given, else sliding_window as is."""
    n = c["num_hidden_layers"]
    if c.get("hybrid_layer_pattern") is not None:
        types = tuple("swa" if p == 1 else "full" for p in c["hybrid_layer_pattern"])
    elif c.get("layer_types"):
        types = tuple("full" if t == "full_attention" else "swa" for t in c["layer_types"])
    else:   # transformers' default: full on layer 0 and every 6th layer
        types = tuple("full" if i == 0 or (i + 1) % 6 == 0 else "swa" for i in range(n))
    freq = c.get("moe_layer_freq")
    if isinstance(freq, list):
        mlp = tuple("sparse" if f else "dense" for f in freq)
    elif c.get("mlp_layer_types"):
        mlp = tuple(c["mlp_layer_types"])
    else:
        mlp = ("dense",) + ("sparse",) * (n - 1)
    if c.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"mimo_v2_flash with hidden_act={c['hidden_act']!r} is not supported")
    if c.get("attention_bias"):
        raise ConfigError("mimo_v2_flash with attention_bias is not supported")
    if c.get("n_shared_experts"):
        raise ConfigError("mimo_v2_flash with shared experts is not supported")
    if c.get("scoring_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"mimo_v2_flash with scoring_func={c['scoring_func']!r} is not supported")
    heads = c["num_attention_heads"]
    if c.get("swa_num_attention_heads", heads) != heads:
        raise ConfigError("mimo_v2_flash with different query head counts per layer kind "
                          "is not supported")
    hd, vd = c.get("head_dim", 192), c.get("v_head_dim", 128)
    swa_hd, swa_vd = c.get("swa_head_dim", hd), c.get("swa_v_head_dim", vd)
    kv = c.get("num_key_value_heads", 4)
    swa_kv = c.get("swa_num_key_value_heads", 2 * kv)     # transformers ties it to 2x
    theta, pf = _mimo_rope(c, "full")
    local, swa_pf = _mimo_rope(c, "swa")
    if c.get("sliding_window_size") is not None:
        window = int(c["sliding_window_size"]) + 1
    else:
        window = int(c.get("sliding_window") or 129)
    # transformers: a null value scale means none; a missing one its default, 0.707.
    vs = c.get("attention_value_scale", 0.707)
    rsf = c.get("routed_scaling_factor")
    return ModelConfig(
        arch="mimo_v2_flash", vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_layers=n, num_heads=heads,
        layer_types=types, full_kv_heads=kv, swa_kv_heads=swa_kv, head_dim=hd, v_head_dim=vd,
        swa_head_dim=swa_hd, swa_v_head_dim=swa_vd, sliding_window=window,
        rope_theta=theta, rope_local_theta=local,
        rms_norm_eps=c.get("layernorm_epsilon", c.get("rms_norm_eps", 1e-5)),
        max_position=c.get("max_position_embeddings", 131072), query_pre_attn_scalar=None,
        tie_word_embeddings=c.get("tie_word_embeddings", False),
        bos_token_id=c.get("bos_token_id"), eos_token_ids=_eos_ids(c.get("eos_token_id")),
        rotary_dim=int(hd * pf), swa_rotary_dim=int(swa_hd * swa_pf),
        full_attention_sink=bool(c.get("add_full_attention_sink_bias", False)),
        swa_attention_sink=bool(c.get("add_swa_attention_sink_bias", True)),
        attention_value_scale=1.0 if vs is None else float(vs),
        mlp_types=mlp, num_experts=c.get("n_routed_experts", c.get("num_local_experts", 0)),
        num_experts_per_tok=c.get("num_experts_per_tok", 0),
        moe_intermediate_size=c.get("moe_intermediate_size", 0),
        n_group=c.get("n_group") or 1, topk_group=c.get("topk_group") or 1,
        norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        routed_scaling_factor=1.0 if rsf is None else float(rsf),
        # The checkpoint's weights decide in the end (registry.load counts model.mtp.layers.*).
        num_mtp_layers=int(c.get("num_nextn_predict_layers") or 0))




def _refuse_quantized(c: dict[str, Any]) -> None:
    """Weights are read as plain floats: a quantized checkpoint (FP8 block-quantized
    MiMo-V2-Flash, GPTQ, AWQ, ...) would load as garbage, so it is refused by name."""
    q = c.get("quantization_config")
    if not q:
        return
    method = q.get("quant_method", "unknown") if isinstance(q, dict) else "unknown"
    detail = ""
    if isinstance(q, dict) and (q.get("fmt") or q.get("weight_block_size")):
        detail = f" (fmt={q.get('fmt')!r}, weight_block_size={q.get('weight_block_size')!r})"
    raise ConfigError(
        f"this checkpoint's weights are quantized: quantization_config.quant_method="
        f"{method!r}{detail}. This build runs bfloat16/float32 weights only (there is no "
        f"{method} kernel on this device); use a bf16 checkpoint or dequantize it first")
def _qwen_vision(c: dict[str, Any]) -> VisionConfig:
    v = c.get("vision_config") or {}
    if v.get("hidden_act", "silu") != "silu":
        raise ConfigError("qwen2_5_vl vision tower with hidden_act != silu is not supported")
    theta = (v.get("rope_parameters") or {}).get("rope_theta", 10_000.0)
    return VisionConfig(
        depth=v.get("depth", 32), hidden_size=v.get("hidden_size", 1280),
        intermediate_size=v.get("intermediate_size", 3420), num_heads=v.get("num_heads", 16),
        out_hidden_size=v.get("out_hidden_size", 3584),
        fullatt_block_indexes=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
        # Checkpoints from before transformers 4.50 spell two of these differently.
        in_channels=v.get("in_channels", v.get("in_chans", 3)),
        patch_size=v.get("patch_size", v.get("spatial_patch_size", 14)),
        temporal_patch_size=v.get("temporal_patch_size", 2),
        spatial_merge_size=v.get("spatial_merge_size", 2), window_size=v.get("window_size", 112),
        tokens_per_second=float(v.get("tokens_per_second", 4)), rope_theta=float(theta),
        image_token_id=c.get("image_token_id", 151655),
        video_token_id=c.get("video_token_id", 151656),
        vision_start_token_id=c.get("vision_start_token_id", 151652),
        vision_end_token_id=c.get("vision_end_token_id", 151653))


def vision_preprocessing(vision: VisionConfig, pre: dict[str, Any]) -> VisionConfig:
    """`vision` with the image preprocessing of a checkpoint's preprocessor_config.json
    (Qwen2VLImageProcessor: `min_pixels` / `max_pixels`, or transformers 5's
    `size.shortest_edge` / `size.longest_edge`; `image_mean`, `image_std`). Its patch
    geometry must be the vision tower's: a mismatch means a broken checkpoint."""
    if not isinstance(pre, dict):
        raise ConfigError("preprocessor_config.json must hold a JSON object")
    for key, ours in (("patch_size", vision.patch_size), ("merge_size", vision.spatial_merge_size),
                      ("temporal_patch_size", vision.temporal_patch_size)):
        if key in pre and pre[key] != ours:
            raise ConfigError(f"preprocessor_config.json has {key}={pre[key]!r} but the "
                              f"vision tower's config.json says {ours}")
    size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
    lo = pre.get("min_pixels", size.get("shortest_edge", vision.min_pixels))
    hi = pre.get("max_pixels", size.get("longest_edge", vision.max_pixels))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 0 < lo <= hi:
        raise ConfigError(f"preprocessor_config.json pixel bounds must be integers with "
                          f"0 < min_pixels <= max_pixels, not {lo!r} and {hi!r}")
    out = {"min_pixels": lo, "max_pixels": hi}
    for key in ("image_mean", "image_std"):
        v = pre.get(key, getattr(vision, key))
        if (not isinstance(v, (list, tuple)) or len(v) != 3
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise ConfigError(f"preprocessor_config.json {key} must be 3 numbers, not {v!r}")
        out[key] = tuple(float(x) for x in v)
    if min(out["image_std"]) <= 0:
        raise ConfigError("preprocessor_config.json image_std must be > 0")
    return dataclasses.replace(vision, **out)


def qwen2_5_vl_config(c: dict[str, Any]) -> ModelConfig:
    """Qwen2.5-VL: a Qwen2 language model (full attention everywhere, GQA, q/k/v bias) with
    multimodal RoPE, plus a window-attention ViT. transformers 5 nests the text settings in
    `text_config`; older checkpoints keep them at the top level. Both are read, the nested
    one winning."""
    t = {**c, **(c.get("text_config") or {})}
    if t.get("use_sliding_window"):
        raise ConfigError("qwen2_5_vl with use_sliding_window is not supported")
    if t.get("hidden_act", "silu") != "silu":
        raise ConfigError("qwen2_5_vl with hidden_act != silu is not supported")
    rp = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"qwen2_5_vl RoPE scaling {rope_type!r} is not supported")
    theta = float(rp.get("rope_theta", t.get("rope_theta", 1_000_000.0)))
    heads = t["num_attention_heads"]
    hd = t["hidden_size"] // heads
    kv = t.get("num_key_value_heads") or heads
    n = t["num_hidden_layers"]
    max_pos = t.get("max_position_embeddings", 32768)
    tie = bool(c.get("tie_word_embeddings") or (c.get("text_config") or {}).get("tie_word_embeddings"))
    return ModelConfig(
        arch="qwen2_5_vl", vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"], num_layers=n, num_heads=heads,
        layer_types=("full",) * n, full_kv_heads=kv, swa_kv_heads=kv, head_dim=hd,
        v_head_dim=hd, swa_head_dim=hd, swa_v_head_dim=hd,
        sliding_window=max_pos, rope_theta=theta, rope_local_theta=theta,
        rms_norm_eps=t.get("rms_norm_eps", 1e-6), max_position=max_pos,
        query_pre_attn_scalar=None, tie_word_embeddings=tie,
        bos_token_id=t.get("bos_token_id"), eos_token_ids=_eos_ids(t.get("eos_token_id")),
        mrope_section=tuple(rp.get("mrope_section", (16, 24, 24))), attention_bias=True,
        vision=_qwen_vision(c))


HF_CONFIGS = {"gemma3": gemma3_config, "gemma3_text": gemma3_config, "llama": llama_config,
              "mimo_v2_flash": mimo_v2_flash_config, "qwen2_5_vl": qwen2_5_vl_config}


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    mt = c.get("model_type")
    if mt not in HF_CONFIGS:
        raise ConfigError(f"unsupported model_type {mt!r}; supported: {', '.join(sorted(HF_CONFIGS))}")
    _refuse_quantized(c)
    return HF_CONFIGS[mt](c)
