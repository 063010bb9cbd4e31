"""Gemma 3 (text): 5 sliding-window layers per full-attention layer, GQA, q/k RMSNorm,
separate RoPE bases for local (SWA) and global (full) layers, scaled embeddings, tied head.

Weights come in Hugging Face naming with HF's norm convention (the model multiplies by
1 + w); the GGUF reader below translates llama.cpp's (1 + w) norms back to it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..config import ConfigError, ModelConfig
from ..gpu.attention import AttentionBackend, AttnBatch
from .architecture import GGUF_LAYER_NAMES, Architecture, GGUFFormat, eos_ids
from .attention import Attention
from .decoder import DecoderLM
from .gguf_file import GGUFFile
from .layers import RMSNorm, Rotary, add_norm
from .mlp import GatedMLP
from .tiny import gemma3 as tiny


class Gemma3Layer(nn.Module):
    """Sandwich norms: each block's input and output are normed, then added to the residual."""

    def __init__(self, cfg: ModelConfig, i: int, w: dict, dtype: torch.dtype):
        super().__init__()
        p = f"model.layers.{i}."
        eps = cfg.rms_norm_eps
        self.kind = cfg.layer_types[i]
        self.attn = Attention(cfg, self.kind, w, p + "self_attn.", dtype, qk_norm=True)
        self.mlp = GatedMLP.load(w, p + "mlp.", dtype, act="gelu_pytorch_tanh")
        self.input_norm = RMSNorm(cfg.hidden_size, eps, w[p + "input_layernorm.weight"])
        self.post_attn_norm = RMSNorm(cfg.hidden_size, eps, w[p + "post_attention_layernorm.weight"])
        self.pre_ff_norm = RMSNorm(cfg.hidden_size, eps, w[p + "pre_feedforward_layernorm.weight"])
        self.post_ff_norm = RMSNorm(cfg.hidden_size, eps, w[p + "post_feedforward_layernorm.weight"])

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                backend: AttentionBackend) -> torch.Tensor:
        h = self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        x, y = add_norm(x, h, self.post_attn_norm, self.pre_ff_norm,
                        self.mlp.input_dtype(x.numel() // x.shape[-1]))
        assert y is not None
        x, _ = add_norm(x, self.mlp(y), self.post_ff_norm, None)
        return x


class Gemma3ForCausalLM(DecoderLM):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__(cfg)
        # Each module casts the tensors it keeps (RMSNorm holds its weights in float32): no
        # converted copy of the whole dict.
        w = weights
        max_pos = cfg.max_position
        d_full, d_swa = cfg.kv_shape("full")[1], cfg.kv_shape("swa")[1]
        self.rope = nn.ModuleDict({
            "full": Rotary(d_full, cfg.rope_theta, max_pos, cfg.rope_scaling_factor, dtype),
            "swa": Rotary(d_swa, cfg.rope_local_theta, max_pos, dtype=dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"].to(dtype), requires_grad=False)
        # HF casts the scale to the weight dtype before multiplying; do the same.
        self.embed_scale = torch.tensor(cfg.hidden_size ** 0.5).to(dtype)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, i, w, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"])
        self.lm_head = self._head(w, dtype, required=False)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed_tokens(input_ids) * self.embed_scale


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
        bos_token_id=c.get("bos_token_id"), eos_token_ids=eos_ids(c.get("eos_token_id")),
        rope_scaling_factor=factor)


# Gemma's ffn_norm is the first of the two norms around the MLP.
GGUF_NAMES = {**GGUF_LAYER_NAMES, "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
              "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def _gguf_config(f: GGUFFile) -> dict:
    md, a = f.metadata, "gemma3"
    hd = int(md[f"{a}.attention.key_length"])
    return {
        "model_type": "gemma3_text", "vocab_size": len(md["tokenizer.ggml.tokens"]),
        "hidden_size": int(md[f"{a}.embedding_length"]),
        "intermediate_size": int(md[f"{a}.feed_forward_length"]),
        "num_hidden_layers": int(md[f"{a}.block_count"]),
        "num_attention_heads": int(md[f"{a}.attention.head_count"]),
        "num_key_value_heads": int(md[f"{a}.attention.head_count_kv"]),
        "head_dim": hd,
        "sliding_window": int(md[f"{a}.attention.sliding_window"]),
        "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(md.get(f"{a}.rope.freq_base", 1_000_000.0)),
        # Not stored in GGUF; every Gemma 3 checkpoint uses 10k for local layers.
        "rope_local_base_freq": 10_000.0,
        "max_position_embeddings": int(md[f"{a}.context_length"]),
        "query_pre_attn_scalar": hd,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "tie_word_embeddings": "output.weight" not in f.tensors,
    }


def _gguf_to_hf(name: str, w: torch.Tensor, md: Mapping[str, Any]) -> torch.Tensor:
    """llama.cpp stores Gemma's norm weights as 1 + w."""
    return w - 1.0 if name.endswith("norm.weight") else w


ARCHITECTURE = Architecture(
    name="gemma3", model_types=("gemma3", "gemma3_text"), hf_config=gemma3_config,
    model=Gemma3ForCausalLM, gguf=GGUFFormat(GGUF_NAMES, _gguf_config, _gguf_to_hf),
    tiny=tiny.write)
