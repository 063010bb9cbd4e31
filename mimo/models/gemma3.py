"""Gemma 3 (text): 5 sliding-window layers per full-attention layer, GQA, q/k RMSNorm,
separate RoPE bases for local (SWA) and global (full) layers, scaled embeddings, tied head.

Weights come in Hugging Face naming with HF's norm convention (the model multiplies by
1 + w); loaders translate other formats to it.
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


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str, w: dict, p: str):
        super().__init__()
        self.kind = kind
        self.hq = cfg.num_heads
        self.hkv, self.d, self.dv = cfg.kv_shape(kind)
        self.qkv = Linear(torch.cat([w[p + "q_proj.weight"], w[p + "k_proj.weight"],
                                     w[p + "v_proj.weight"]]))
        self.o = Linear(w[p + "o_proj.weight"])
        # q and k heads sit side by side in the qkv output: one norm call covers both.
        qk_w = torch.cat([w[p + "q_norm.weight"].expand(self.hq, -1),
                          w[p + "k_norm.weight"].expand(self.hkv, -1)])
        self.qk_norm = RMSNorm(self.d, cfg.rms_norm_eps, qk_w)
        self.scale = (cfg.query_pre_attn_scalar or self.d) ** -0.5

    def forward(self, x, rope, k_cache, v_cache, batch, backend: AttentionBackend):
        T = x.shape[0]
        qkv = self.qkv(x)
        nqk = (self.hq + self.hkv) * self.d
        qk = Rotary.apply(self.qk_norm(qkv[:, :nqk].view(T, self.hq + self.hkv, self.d)), rope)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, nqk:].view(T, self.hkv, self.dv)
        o = backend.forward(q, k, v, k_cache, v_cache, batch, self.scale)
        return self.o(o.reshape(T, self.hq * self.dv))


class Gemma3MLP(nn.Module):
    def __init__(self, w: dict, p: str):
        super().__init__()
        self.gate_up = Linear(torch.cat([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]]))
        self.down = Linear(w[p + "down_proj.weight"])

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(g, approximate="tanh") * u)


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int, w: dict):
        super().__init__()
        p = f"model.layers.{i}."
        eps = cfg.rms_norm_eps
        self.kind = cfg.layer_types[i]
        self.attn = Gemma3Attention(cfg, self.kind, w, p + "self_attn.")
        self.mlp = Gemma3MLP(w, p + "mlp.")
        self.input_norm = RMSNorm(cfg.hidden_size, eps, w[p + "input_layernorm.weight"])
        self.post_attn_norm = RMSNorm(cfg.hidden_size, eps, w[p + "post_attention_layernorm.weight"])
        self.pre_ff_norm = RMSNorm(cfg.hidden_size, eps, w[p + "pre_feedforward_layernorm.weight"])
        self.post_ff_norm = RMSNorm(cfg.hidden_size, eps, w[p + "post_feedforward_layernorm.weight"])

    def forward(self, x, rope, k_cache, v_cache, batch, backend):
        h = self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        x = x + self.post_attn_norm(h)
        h = self.mlp(self.pre_ff_norm(x))
        return x + self.post_ff_norm(h)


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        w = {k: (v.to(dtype) if "norm" not in k else v.float()) for k, v in weights.items()}
        max_pos = cfg.max_position
        d_full, d_swa = cfg.kv_shape("full")[1], cfg.kv_shape("swa")[1]
        self.rope = nn.ModuleDict({
            "full": Rotary(d_full, cfg.rope_theta, max_pos, cfg.rope_scaling_factor, dtype),
            "swa": Rotary(d_swa, cfg.rope_local_theta, max_pos, dtype=dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"], requires_grad=False)
        # HF casts the scale to the weight dtype before multiplying; do the same.
        self.embed_scale = torch.tensor(cfg.hidden_size ** 0.5).to(dtype)
        self.layers = nn.ModuleList(
            Gemma3Layer(cfg, i, w) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"])
        head = w.get("lm_head.weight", self.embed) if not cfg.tie_word_embeddings else self.embed
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
        x = F.embedding(input_ids, self.embed) * self.embed_scale
        tables = {kind: rope.tables(positions) for kind, rope in self.rope.items()}
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = ctx.kv[i]
            x = layer(x, tables[layer.kind], k_cache, v_cache, ctx.batches[layer.kind], ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)
