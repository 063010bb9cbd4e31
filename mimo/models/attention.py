"""The decoder attention every family uses: fused q/k/v projection, GQA over the paged KV
cache through an `AttentionBackend`, output projection.

Options, all read from `ModelConfig` except `qk_norm`:
- per-kind shapes: KV heads and q/k and v head dims come from `cfg.kv_shape(kind)`, so full
  and SWA layers may differ (MiMo-V2-Flash: twice the KV heads on SWA layers);
- `cfg.attention_bias`: a fused q/k/v bias (Qwen2; zeros where a checkpoint has none);
- `qk_norm`: Gemma's RMSNorm (1 + w) on every q and k head, before RoPE;
- partial RoPE: the rotary tables decide (`Rotary.rotate` rotates the tables' dims only);
- `cfg.{full,swa}_attention_sink`: a learned sink logit per head on that kind;
- `cfg.attention_value_scale`: values multiplied before they are cached;
- softmax scale `(cfg.query_pre_attn_scalar or qk head dim) ** -0.5`.

Weights come in Hugging Face naming under `prefix` (`model.layers.{i}.self_attn.`).
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..gpu.attention import AttentionBackend, AttnBatch
from .layers import Linear, RMSNorm, Rotary, stack_rows
from .untraced import untraced

# Spellings of the sink logits: transformers' in-memory one, then the hub checkpoint's.
_SINK_NAMES = ("sinks", "attention_sink_bias")


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str, w: dict, prefix: str, dtype: torch.dtype,
                 qk_norm: bool = False, value_scale: float | None = None):
        super().__init__()
        p = prefix
        self.kind = kind
        self.hq = cfg.num_heads
        self.hkv, self.d, self.dv = cfg.kv_shape(kind)
        names = [p + n for n in ("q_proj", "k_proj", "v_proj")]
        self.qkv = Linear(stack_rows([w[n + ".weight"] for n in names], dtype),
                          tuple(n + ".weight" for n in names))
        self.o = Linear(w[p + "o_proj.weight"].to(dtype), (p + "o_proj.weight",))
        # One bias row for the fused projection; checkpoints without biases get zeros.
        self.qkv_bias = (nn.Parameter(torch.cat([
            w.get(n + ".bias", torch.zeros(w[n + ".weight"].shape[0], dtype=w[n + ".weight"].dtype))
            for n in names]).to(dtype), requires_grad=False) if cfg.attention_bias else None)
        # q and k heads sit side by side in the qkv output: one norm call covers both.
        self.qk_norm = (RMSNorm(self.d, cfg.rms_norm_eps, torch.cat([
            w[p + "q_norm.weight"].expand(self.hq, -1),
            w[p + "k_norm.weight"].expand(self.hkv, -1)])) if qk_norm else None)
        has_sink = cfg.swa_attention_sink if kind == "swa" else cfg.full_attention_sink
        # Sinks in the model dtype, as transformers keeps them; the backend adds them in fp32.
        self.sinks = (nn.Parameter(_sinks(w, p).to(dtype), requires_grad=False)
                      if has_sink else None)
        self.scale = (cfg.query_pre_attn_scalar or self.d) ** -0.5
        self.v_scale = cfg.attention_value_scale if value_scale is None else value_scale

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                backend: AttentionBackend) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv(x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        nqk = (self.hq + self.hkv) * self.d
        # One norm and RoPE call covers the q and k heads side by side.
        qk = Rotary.norm_rotate(qkv, self.hq + self.hkv, self.d, self.qk_norm, rope)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, nqk:].view(T, self.hkv, self.dv)
        if self.v_scale != 1.0:
            v = v * self.v_scale          # before caching: the cache holds scaled values
        o = paged_attention(backend, q, k, v, k_cache, v_cache, batch, self.scale, self.sinks)
        return self.o(o.reshape(T, self.hq * self.dv))


@untraced
def paged_attention(backend: AttentionBackend, q, k, v, k_cache, v_cache, batch: AttnBatch,
                    scale: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """The backend's call, never traced by `torch.compile`: what it gathers depends on the
    step's page lists (python data in `batch`), and it writes the caches in place. A
    compiled layer breaks its graph here and resumes after."""
    return backend.forward(q, k, v, k_cache, v_cache, batch, scale, sinks)


def _sinks(w: dict, p: str) -> torch.Tensor:
    for name in _SINK_NAMES:
        if p + name in w:
            return w[p + name]
    raise KeyError(f"missing {p}sinks (or {p}attention_sink_bias): the config says this "
                   f"layer kind has attention sinks")
