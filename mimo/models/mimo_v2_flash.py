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

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..gpu.attention import AttentionBackend
from .context import ForwardContext
from .layers import Linear, Rotary
from .llama import LlamaRMSNorm
from .lm_head import LMHead
from .mimo_v2_flash_mtp import MiMoMTPLayer
from .moe import SparseMoE

_MTP_RE = re.compile(r"^model\.mtp\.layers\.(\d+)\.")


def mtp_layers_in(weights: dict[str, torch.Tensor]) -> int:
    """How many MTP layers a checkpoint holds (`model.mtp.layers.{k}.*`, k = 0, 1, ...):
    the weights decide, as configs do not always declare them."""
    ks = {int(m.group(1)) for name in weights if (m := _MTP_RE.match(name))}
    n = 0
    while n in ks:
        n += 1
    return n


def _sinks(w: dict, p: str) -> torch.Tensor:
    for name in ("self_attn.sinks", "self_attn.attention_sink_bias"):
        if p + name in w:
            return w[p + name]
    raise KeyError(f"missing {p}self_attn.sinks (or .attention_sink_bias): the config says "
                   f"this layer kind has attention sinks")


class MiMoAttention(nn.Module):
    """GQA with per-kind shapes, partial RoPE, value scale and optional sink logits."""

    def __init__(self, cfg: ModelConfig, kind: str, w: dict, p: str, dtype: torch.dtype,
                 value_scale: float | None = None):
        super().__init__()
        self.kind = kind
        self.hq = cfg.num_heads
        self.hkv, self.d, self.dv = cfg.kv_shape(kind)
        a = p + "self_attn."
        self.qkv = Linear(torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"],
                                     w[a + "v_proj.weight"]]).to(dtype))
        self.o = Linear(w[a + "o_proj.weight"].to(dtype))
        has_sink = cfg.swa_attention_sink if kind == "swa" else cfg.full_attention_sink
        # Sinks in the model dtype, as transformers keeps them; the backend adds them in fp32.
        self.sinks = (nn.Parameter(_sinks(w, p).to(dtype), requires_grad=False)
                      if has_sink else None)
        self.scale = self.d ** -0.5
        self.v_scale = cfg.attention_value_scale if value_scale is None else value_scale

    def forward(self, x, rope, k_cache, v_cache, batch, backend: AttentionBackend):
        T = x.shape[0]
        qkv = self.qkv(x)
        nqk = (self.hq + self.hkv) * self.d
        # q and k heads sit side by side in the qkv output: one RoPE call covers both.
        qk = Rotary.apply(qkv[:, :nqk].view(T, self.hq + self.hkv, self.d), rope)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, nqk:].view(T, self.hkv, self.dv)
        if self.v_scale != 1.0:
            v = v * self.v_scale          # before caching: the cache holds scaled values
        o = backend.forward(q, k, v, k_cache, v_cache, batch, self.scale, self.sinks)
        return self.o(o.reshape(T, self.hq * self.dv))


class MiMoMLP(nn.Module):
    def __init__(self, w: dict, p: str, dtype: torch.dtype):
        super().__init__()
        self.gate_up = Linear(torch.cat([w[p + "gate_proj.weight"],
                                         w[p + "up_proj.weight"]]).to(dtype))
        self.down = Linear(w[p + "down_proj.weight"].to(dtype))

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


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


class MiMoLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int, w: dict, dtype: torch.dtype):
        super().__init__()
        p = f"model.layers.{i}."
        eps, H = cfg.rms_norm_eps, cfg.hidden_size
        self.kind = cfg.layer_types[i]
        self.attn = MiMoAttention(cfg, self.kind, w, p, dtype)
        sparse = bool(cfg.mlp_types) and cfg.mlp_types[i] == "sparse"
        self.mlp = _moe(cfg, w, p, dtype) if sparse else MiMoMLP(w, p + "mlp.", dtype)
        self.input_norm = LlamaRMSNorm(H, eps, w[p + "input_layernorm.weight"], dtype)
        self.post_attn_norm = LlamaRMSNorm(H, eps, w[p + "post_attention_layernorm.weight"], dtype)

    def forward(self, x, rope, k_cache, v_cache, batch, backend):
        x = x + self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        return x + self.mlp(self.post_attn_norm(x))


class MiMoV2FlashForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        w = weights
        max_pos = cfg.max_position
        self.rope = nn.ModuleDict({
            "full": Rotary(cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, max_pos, dtype=dtype),
            "swa": Rotary(cfg.swa_rotary_dim or cfg.swa_head_dim, cfg.rope_local_theta, max_pos,
                          dtype=dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"].to(dtype), requires_grad=False)
        self.layers = nn.ModuleList(MiMoLayer(cfg, i, w, dtype) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        if cfg.tie_word_embeddings:
            head = self.embed
        elif "lm_head.weight" in w:
            head = w["lm_head.weight"].to(dtype)
        else:
            raise ValueError("untied mimo_v2_flash checkpoint has no lm_head.weight")
        self.lm_head = LMHead(Linear(head))
        self.mtp = nn.ModuleList(MiMoMTPLayer(cfg, k, w, dtype)
                                 for k in range(cfg.num_mtp_layers))

    def quantize_int8(self) -> None:
        for m in self.modules():
            if isinstance(m, Linear):
                m.quantize_int8()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Flattened tokens of every scheduled sequence -> final hidden states of
        `logit_rows` (all rows if None), ready for `lm_head.logits` or `lm_head.greedy`,
        and the `hidden_prev` of MTP layer 0."""
        x = F.embedding(input_ids, self.embed)
        tables = {kind: rope.tables(positions) for kind, rope in self.rope.items()}
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = ctx.kv[i]
            x = layer(x, tables[layer.kind], k_cache, v_cache, ctx.batches[layer.kind], ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)

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
        emb = F.embedding(input_ids, self.embed)
        rope = self.rope["swa"].tables(positions)
        k_cache, v_cache = ctx.kv[self.cfg.num_layers + k]
        x = self.mtp[k](emb, hidden_prev, rope, k_cache, v_cache, ctx.batches["swa"], ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return x
