"""MiMo-V2-Flash: hybrid SWA (9 full + 39 SWA layers, window 128 + the query itself), per-kind
attention shapes (SWA layers: twice the KV heads and a learned attention-sink logit per
head), q/k head dim 192 / v head dim 128, partial RoPE (64 of 192 dims) with a RoPE base per
layer kind, values scaled by `attention_value_scale` before caching, a dense first layer and
sigmoid-routed MoE layers (256 experts, top-8), plain RMSNorm (x * w), untied head; plus the
checkpoint's multi-token-prediction (MTP) layers (mimo_v2_flash_mtp.py).

Weights are accepted in both spellings: transformers' in-memory one (`self_attn.sinks`, fused
`mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I]) and the hub checkpoint's
(`self_attn.attention_sink_bias`, `mlp.experts.{e}.{gate,up,down}_proj.weight`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch
from torch import nn

from ..config import ConfigError, ModelConfig
from .architecture import Architecture, eos_ids
from .context import ForwardContext
from .decoder import DecoderLM, PreNormLayer
from .layers import LlamaRMSNorm, Rotary
from .mimo_v2_flash_mtp import MiMoMTPLayer, mtp_layers_in
from .moe import SparseMoE
from .tiny import mimo_v2_flash as tiny


def _moe(cfg: ModelConfig, w: dict, p: str, dtype: torch.dtype) -> SparseMoE:
    m = p + "mlp."
    if m + "experts.gate_up_proj" in w:           # transformers' fused layout
        gate_up, down = w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"]
    else:                                         # the hub checkpoint: one module per expert
        e = m + "experts.{}."
        gate_up = torch.stack([torch.cat([w[e.format(i) + "gate_proj.weight"],
                                          w[e.format(i) + "up_proj.weight"]])
                               for i in range(cfg.num_experts)])
        down = torch.stack([w[e.format(i) + "down_proj.weight"] for i in range(cfg.num_experts)])
    if gate_up.shape[0] != cfg.num_experts:
        raise ValueError(f"{m}experts has {gate_up.shape[0]} experts, config says {cfg.num_experts}")
    return SparseMoE(w[m + "gate.weight"], w.get(m + "gate.e_score_correction_bias"),
                     gate_up.to(dtype), down.to(dtype), cfg.num_experts_per_tok, cfg.n_group,
                     cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)


class MiMoV2FlashForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__(cfg)
        # Converted tensor by tensor (not the whole dict up front): the full checkpoint is large.
        w = weights
        max_pos = cfg.max_position
        self.rope = nn.ModuleDict({
            "full": Rotary(cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, max_pos, dtype=dtype),
            "swa": Rotary(cfg.swa_rotary_dim or cfg.swa_head_dim, cfg.rope_local_theta, max_pos,
                          dtype=dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"].to(dtype), requires_grad=False)
        self.layers = nn.ModuleList(
            PreNormLayer.load(cfg, i, w, dtype, _moe(cfg, w, f"model.layers.{i}.", dtype)
                              if cfg.mlp_types and cfg.mlp_types[i] == "sparse" else None)
            for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        self.lm_head = self._head(w, dtype)
        self.mtp = nn.ModuleList(MiMoMTPLayer(cfg, k, w, dtype)
                                 for k in range(cfg.num_mtp_layers))

    @torch.inference_mode()
    def mtp_forward(self, k: int, input_ids: torch.Tensor, positions: torch.Tensor,
                    hidden_prev: torch.Tensor, ctx: ForwardContext,
                    logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """MTP layer `k`, for a speculative-decoding drafter.

        Row r combines `hidden_prev[r]`, the output at some position p (the main model's
        `forward` output for k = 0, MTP layer k-1's `mtp_forward` output after it), with
        `input_ids[r]`, the token at p + 1, and predicts the token after that. SGLang and vLLM
        run the row at the hidden state's position (`positions[r]` = p); this method attends
        at whatever `positions` it is given, over layer k's own KV cache:
        `ctx.kv[cfg.num_layers + k]`, an SWA-pool layer addressed by `ctx.batches['swa']`.

        Returns final-normed hidden states (of `logit_rows`; all rows if None): logits through
        the shared `lm_head`, and the `hidden_prev` of layer k + 1."""
        if not 0 <= k < len(self.mtp):
            raise IndexError(f"MTP layer {k} of {len(self.mtp)}")
        emb = self.embed_tokens(input_ids)
        rope = cast(Rotary, self.rope["swa"]).tables(positions)   # ModuleDict is not generic
        k_cache, v_cache = ctx.kv[self.cfg.num_layers + k]
        x = self.mtp[k](emb, hidden_prev, rope, k_cache, v_cache, ctx.batches["swa"], ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return x


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
        bos_token_id=c.get("bos_token_id"), eos_token_ids=eos_ids(c.get("eos_token_id")),
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
        # The checkpoint's weights decide in the end (ARCHITECTURE.from_weights counts model.mtp.layers.*).
        num_mtp_layers=int(c.get("num_nextn_predict_layers") or 0))


def _from_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> ModelConfig:
    """MTP layers: the checkpoint's weights decide, whatever the config declares."""
    return dataclasses.replace(cfg, num_mtp_layers=mtp_layers_in(weights))


ARCHITECTURE = Architecture(
    name="mimo_v2_flash", model_types=("mimo_v2_flash",), hf_config=mimo_v2_flash_config,
    model=MiMoV2FlashForCausalLM, tiny=tiny.write, from_weights=_from_weights)
