"""Llama (and models of its shape: SmolLM2, TinyLlama, ...): every layer full attention, GQA,
SiLU-gated MLP, RMSNorm scaled by w (not Gemma's 1 + w), one RoPE base, no embedding scale,
tied or untied head.

Weights come in Hugging Face naming and conventions (q/k rows in rotate-half order); the GGUF
reader below undoes llama.cpp's q/k permutation before they get here. Every layer is 'full',
so the KV layout has no SWA pool and all layers read `ctx.batches['full']`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..config import ConfigError, ModelConfig
from .architecture import GGUF_LAYER_NAMES, Architecture, GGUFFormat, eos_ids
from .decoder import DecoderLM, PreNormLayer
from .gguf_file import GGUFFile
from .layers import LlamaRMSNorm, Rotary


class LlamaForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__(cfg)
        if cfg.swa_layers:
            raise ValueError("the llama model has full-attention layers only")
        # Each module casts the tensors it keeps: no converted copy of the whole dict.
        w = weights
        self.rope = nn.ModuleDict({"full": Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position,
                                                  cfg.rope_scaling_factor, dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"].to(dtype), requires_grad=False)
        self.layers = nn.ModuleList(PreNormLayer.load(cfg, i, w, dtype) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        self.lm_head = self._head(w, dtype)


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
        bos_token_id=c.get("bos_token_id"), eos_token_ids=eos_ids(c.get("eos_token_id")),
        rope_scaling_factor=factor)


# llama's ffn_norm is the (only) norm before the MLP.
GGUF_NAMES = {**GGUF_LAYER_NAMES, "ffn_norm": "post_attention_layernorm"}


def _gguf_config(f: GGUFFile) -> dict:
    md, a = f.metadata, "llama"
    hidden = int(md[f"{a}.embedding_length"])
    heads = int(md[f"{a}.attention.head_count"])
    kv = md.get(f"{a}.attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise ValueError(f"{f.path}: per-layer KV head counts are not supported")
    hd = int(md.get(f"{a}.attention.key_length", hidden // heads))
    if int(md.get(f"{a}.attention.value_length", hd)) != hd:
        raise ValueError(f"{f.path}: llama with value_length != key_length is not supported")
    if int(md.get(f"{a}.rope.dimension_count", hd)) != hd:
        raise ValueError(f"{f.path}: llama with partial RoPE (rope.dimension_count "
                         f"{md[f'{a}.rope.dimension_count']} != head_dim {hd}) is not supported")
    if int(md.get(f"{a}.expert_count", 0) or 0) > 0:
        raise ValueError(f"{f.path}: mixture-of-experts llama GGUF files are not supported")
    if "rope_freqs.weight" in f.tensors:
        # Llama 3.1+ converters store the llama3 RoPE scaling as per-frequency factors.
        raise ValueError(f"{f.path}: llama3-style RoPE scaling (rope_freqs) is not supported")
    rope: dict = {"rope_type": "default"}
    kind = md.get(f"{a}.rope.scaling.type", "none")
    if kind == "linear":
        rope = {"rope_type": "linear", "factor": float(md[f"{a}.rope.scaling.factor"])}
    elif kind != "none":
        raise ValueError(f"{f.path}: llama RoPE scaling {kind!r} is not supported "
                         f"(supported: none, linear)")
    rope["rope_theta"] = float(md.get(f"{a}.rope.freq_base", 10_000.0))
    return {
        "model_type": "llama",
        "vocab_size": int(md.get(f"{a}.vocab_size", len(md["tokenizer.ggml.tokens"]))),
        "hidden_size": hidden,
        "intermediate_size": int(md[f"{a}.feed_forward_length"]),
        "num_hidden_layers": int(md[f"{a}.block_count"]),
        "num_attention_heads": heads, "num_key_value_heads": int(kv), "head_dim": hd,
        "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_parameters": rope,
        "max_position_embeddings": int(md[f"{a}.context_length"]),
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "tie_word_embeddings": "output.weight" not in f.tensors,
    }


def _gguf_to_hf(name: str, w: torch.Tensor, md: Mapping[str, Any]) -> torch.Tensor:
    if not name.endswith((".attn_q.weight", ".attn_k.weight")):
        return w
    heads = int(md["llama.attention.head_count"])
    if name.endswith(".attn_k.weight"):
        heads = int(md.get("llama.attention.head_count_kv", heads))
    return unpermute_qk(w, heads)


def unpermute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's `permute` of a q/k projection: within each head it reorders rows from
    HF's rotate-half layout (first half, second half) to interleaved pairs. Same as
    transformers' `LlamaTensorProcessor._reverse_permute_weights`."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


ARCHITECTURE = Architecture(
    name="llama", model_types=("llama",), hf_config=llama_config, model=LlamaForCausalLM,
    gguf=GGUFFormat(GGUF_NAMES, _gguf_config, _gguf_to_hf))
