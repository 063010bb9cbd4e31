"""Qwen2.5-VL: a Qwen2 language model (full attention on every layer, GQA, q/k/v bias, RMSNorm
scaled by w, SiLU MLP) with multimodal RoPE, and the vision tower of qwen2_5_vl_vision.py.

The model interface is the one every mimo model has, extended backward-compatibly:
- `positions` may be [3, T] (temporal, height, width; see mrope.py) as well as [T]
  (text only: every axis equal, the same thing as 1-D RoPE);
- `mm_embeds=(rows, embeds)` replaces the token embeddings at `rows` of the flattened batch
  with vision embeddings (where image/video placeholder tokens sit).
`encode(pixel_values, grid_thw)` runs the vision tower for many items at once.

Weights come in Hugging Face naming: `model.*` for the text model (loaders map
transformers 5's `model.language_model.*` to it) and `visual.*` for the vision tower.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .context import ForwardContext
from .layers import Linear
from .llama import LlamaAttention, LlamaLayer, LlamaRMSNorm
from .lm_head import LMHead
from .mrope import MRotary
from .qwen2_5_vl_vision import Qwen2_5_VisionTransformer


class Qwen2Attention(LlamaAttention):
    """Llama attention plus Qwen2's q/k/v bias."""
    def __init__(self, cfg: ModelConfig, w: dict, p: str):
        super().__init__(cfg, w, p)
        names = [p + n for n in ("q_proj", "k_proj", "v_proj")]
        # One bias row for the fused projection; checkpoints without biases get zeros.
        self.qkv_bias = nn.Parameter(torch.cat([
            w.get(n + ".bias", torch.zeros(w[n + ".weight"].shape[0], dtype=w[n + ".weight"].dtype))
            for n in names]), requires_grad=False)


class Qwen2_5_VLForConditionalGeneration(nn.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__()
        if cfg.swa_layers:
            raise ValueError("the qwen2_5_vl model has full-attention layers only")
        self.cfg = cfg
        w = {k: v.to(dtype) for k, v in weights.items() if not k.startswith("visual.")}
        section = cfg.mrope_section or (cfg.head_dim // 2,)
        self.rope = MRotary(cfg.head_dim, cfg.rope_theta, cfg.max_position, section, dtype)
        self.embed = nn.Parameter(w["model.embed_tokens.weight"], requires_grad=False)
        self.layers = nn.ModuleList(LlamaLayer(cfg, i, w, dtype, Qwen2Attention) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        if cfg.tie_word_embeddings:
            head = self.embed
        elif "lm_head.weight" in w:
            head = w["lm_head.weight"]
        else:
            raise ValueError("untied qwen2_5_vl checkpoint has no lm_head.weight")
        self.lm_head = LMHead(Linear(head))
        # A text-only checkpoint of this family (no visual.* weights) still serves text.
        has_vision = cfg.vision is not None and any(k.startswith("visual.") for k in weights)
        self.visual = Qwen2_5_VisionTransformer(cfg.vision, weights, dtype) if has_vision else None

    def quantize_int8(self) -> None:
        for m in self.modules():
            if isinstance(m, Linear):
                m.quantize_int8()

    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        """Patches of many items -> their embeddings, concatenated in item order
        (`qwen2_5_vl_vision.split_embeds` splits them per item)."""
        if self.visual is None:
            raise ValueError("this checkpoint has no vision tower")
        return self.visual(pixel_values, grid_thw)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                logit_rows: torch.Tensor | None = None,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Flattened tokens of every scheduled sequence -> final hidden states of
        `logit_rows` (all rows if None). positions: [T] or [3, T]; mm_embeds: (rows [M],
        embeddings [M, hidden]) put in place of those rows' token embeddings."""
        x = F.embedding(input_ids, self.embed)
        if mm_embeds is not None:
            rows, emb = mm_embeds
            x = x.index_copy(0, rows, emb.to(x.dtype))
        rope = self.rope.tables(positions)
        batch = ctx.batches["full"]
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = ctx.kv[i]
            x = layer(x, rope, k_cache, v_cache, batch, ctx.backend)
        if logit_rows is not None:
            x = x.index_select(0, logit_rows)
        return self.norm(x)
