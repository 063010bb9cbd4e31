"""Llama (and models of its shape: SmolLM2, TinyLlama, ...): every layer full attention, GQA,
SiLU-gated MLP, RMSNorm scaled by w (not Gemma's 1 + w), one RoPE base, no embedding scale,
tied or untied head.

Weights come in Hugging Face naming and conventions (q/k rows in rotate-half order); the GGUF
loader undoes llama.cpp's q/k permutation before they get here. Every layer is 'full', so the
KV layout has no SWA pool and all layers read `ctx.batches['full']`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..gpu.attention import AttentionBackend
from .context import ForwardContext
from .layers import Linear, RMSNorm, Rotary
from .lm_head import LMHead


class LlamaRMSNorm(RMSNorm):
    """RMSNorm scaled by w itself (HF's LlamaRMSNorm). `scale` holds w exactly rather than
    (w - 1) + 1. As in transformers, the float32 normalised value is cast back to the
    activation dtype before the multiply by w (which is in that dtype too)."""

    def __init__(self, dim: int, eps: float, weight: torch.Tensor, dtype: torch.dtype):
        super().__init__(dim, eps)
        self.scale = nn.Parameter(weight.to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.dim,), self.scale.float(), self.eps)
        return self.scale * F.rms_norm(x.float(), (self.dim,), None, self.eps).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, w: dict, p: str):
        super().__init__()
        self.hq = cfg.num_heads
        self.hkv, self.d, self.dv = cfg.kv_shape("full")
        self.qkv = Linear(torch.cat([w[p + "q_proj.weight"], w[p + "k_proj.weight"],
                                     w[p + "v_proj.weight"]]))
        self.o = Linear(w[p + "o_proj.weight"])
        self.scale = self.d ** -0.5
        self.qkv_bias: torch.Tensor | None = None     # Qwen2 sets one (fused q/k/v bias)

    def forward(self, x, rope, k_cache, v_cache, batch, backend: AttentionBackend):
        T = x.shape[0]
        qkv = self.qkv(x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        nqk = (self.hq + self.hkv) * self.d
        # q and k heads sit side by side in the qkv output: one RoPE call covers both.
        qk = Rotary.apply(qkv[:, :nqk].view(T, self.hq + self.hkv, self.d), rope)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, nqk:].view(T, self.hkv, self.dv)
        o = backend.forward(q, k, v, k_cache, v_cache, batch, self.scale)
        return self.o(o.reshape(T, self.hq * self.dv))


class LlamaMLP(nn.Module):
    def __init__(self, w: dict, p: str):
        super().__init__()
        self.gate_up = Linear(torch.cat([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]]))
        self.down = Linear(w[p + "down_proj.weight"])

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class LlamaLayer(nn.Module):
    """Pre-norm decoder layer. `attention`: the attention class (Qwen2 adds q/k/v bias)."""
    def __init__(self, cfg: ModelConfig, i: int, w: dict, dtype: torch.dtype,
                 attention: type[nn.Module] | None = None):
        super().__init__()
        p = f"model.layers.{i}."
        eps = cfg.rms_norm_eps
        self.attn = (attention or LlamaAttention)(cfg, w, p + "self_attn.")
        self.mlp = LlamaMLP(w, p + "mlp.")
        self.input_norm = LlamaRMSNorm(cfg.hidden_size, eps, w[p + "input_layernorm.weight"], dtype)
        self.post_attn_norm = LlamaRMSNorm(cfg.hidden_size, eps,
                                           w[p + "post_attention_layernorm.weight"], dtype)

    def forward(self, x, rope, k_cache, v_cache, batch, backend):
        x = x + self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        return x + self.mlp(self.post_attn_norm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__()
        if cfg.swa_layers:
            raise ValueError("the llama model has full-attention layers only")
        self.cfg = cfg
        w = {k: v.to(dtype) for k, v in weights.items()}
        self.rope = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position,
                           cfg.rope_scaling_factor, dtype)
        self.embed = nn.Parameter(w["model.embed_tokens.weight"], requires_grad=False)
        self.layers = nn.ModuleList(LlamaLayer(cfg, i, w, dtype) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        if cfg.tie_word_embeddings:
            head = self.embed
        elif "lm_head.weight" in w:
            head = w["lm_head.weight"]
        else:
            raise ValueError("untied llama checkpoint has no lm_head.weight")
        self.lm_head = LMHead(Linear(head))

    def quantize_int8(self) -> None:
        for m in self.modules():
            if isinstance(m, Linear):
                m.quantize_int8()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Flattened tokens of every scheduled sequence -> final hidden states of
        `logit_rows` (all rows if None), ready for `lm_head.logits` or `lm_head.greedy`."""
        x = F.embedding(input_ids, self.embed)
        rope = self.rope.tables(positions)
        batch = ctx.batches["full"]
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = ctx.kv[i]
            x = layer(x, rope, k_cache, v_cache, batch, ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)
