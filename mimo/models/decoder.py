"""What every decoder-only family shares: the pre-norm layer (Llama's shape) and the
embed -> layers -> final norm loop with its LM head (`DecoderLM`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..gpu.attention import AttentionBackend, AttnBatch
from .attention import Attention
from .context import ForwardContext
from .layers import Linear, LlamaRMSNorm, quantize_int8
from .lm_head import LMHead
from .mlp import GatedMLP


class PreNormLayer(nn.Module):
    """x + attn(input_norm(x)), then x + mlp(post_attn_norm(x)): HF names the second norm
    `post_attention_layernorm` although it runs before the MLP."""

    def __init__(self, attn: Attention, mlp: nn.Module, input_norm: nn.Module,
                 post_attn_norm: nn.Module):
        super().__init__()
        self.kind = attn.kind
        self.attn, self.mlp = attn, mlp
        self.input_norm, self.post_attn_norm = input_norm, post_attn_norm

    @classmethod
    def load(cls, cfg: ModelConfig, i: int, w: dict, dtype: torch.dtype,
             mlp: nn.Module | None = None) -> PreNormLayer:
        """Layer `i` from HF weights (`model.layers.{i}.*`), norms scaled by w; `mlp`: the
        layer's feed-forward block if not the dense SiLU one (MoE)."""
        p = f"model.layers.{i}."
        eps, H = cfg.rms_norm_eps, cfg.hidden_size
        return cls(Attention(cfg, cfg.layer_types[i], w, p + "self_attn.", dtype),
                   mlp or GatedMLP.load(w, p + "mlp.", dtype),
                   LlamaRMSNorm(H, eps, w[p + "input_layernorm.weight"], dtype),
                   LlamaRMSNorm(H, eps, w[p + "post_attention_layernorm.weight"], dtype))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttnBatch,
                backend: AttentionBackend) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), rope, k_cache, v_cache, batch, backend)
        return x + self.mlp(self.post_attn_norm(x))


class DecoderLM(nn.Module):
    """A decoder-only LM over the paged KV cache. A family's subclass sets `rope` (layer kind
    -> rotary module with `tables(positions)`), `embed`, `layers` (each with a `kind` and the
    `PreNormLayer.forward` signature), `norm` and `lm_head`; `embed_tokens` may scale."""

    rope: nn.ModuleDict
    embed: nn.Parameter
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: LMHead

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg

    def _head(self, w: dict, dtype: torch.dtype, required: bool = True) -> LMHead:
        """The tied embedding, else `lm_head.weight`; an untied checkpoint without one is
        refused if `required`, else tied after all (Gemma's choice)."""
        if self.cfg.tie_word_embeddings:
            head = self.embed
        elif "lm_head.weight" in w:
            head = w["lm_head.weight"].to(dtype)
        elif required:
            raise ValueError(f"untied {self.cfg.arch} checkpoint has no lm_head.weight")
        else:
            head = self.embed
        return LMHead(Linear(head))

    def quantize_int8(self) -> None:
        quantize_int8(self)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                logit_rows: torch.Tensor | None = None,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Flattened tokens of every scheduled sequence -> final hidden states of
        `logit_rows` (all rows if None), ready for `lm_head.logits` or `lm_head.greedy`.
        `positions`: whatever the rotary modules take ([T]; [3, T] for M-RoPE);
        `mm_embeds=(rows [M], embeddings [M, hidden])` put in place of those rows' token
        embeddings (vision embeddings where placeholder tokens sit)."""
        x = self.embed_tokens(input_ids)
        if mm_embeds is not None:
            rows, emb = mm_embeds
            x = x.index_copy(0, rows, emb.to(x.dtype))
        tables = {kind: rope.tables(positions) for kind, rope in self.rope.items()}
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = ctx.kv[i]
            x = layer(x, tables[layer.kind], k_cache, v_cache, ctx.batches[layer.kind], ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)
