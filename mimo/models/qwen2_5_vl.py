"""Qwen2.5-VL: a Qwen2 language model (full attention on every layer, GQA, q/k/v bias, RMSNorm
scaled by w, SiLU MLP) with multimodal RoPE, and the vision tower of qwen2_5_vl_vision.py.

The model interface is the one every mimo model has (`DecoderLM.forward`): `positions` may
be [3, T] (temporal, height, width; see mrope.py) as well as [T] (text only: every axis
equal, the same thing as 1-D RoPE), and `mm_embeds` puts vision embeddings where image/video
placeholder tokens sit. `encode(pixel_values, grid_thw)` runs the vision tower for many items
at once.

Weights come in Hugging Face naming: `model.*` for the text model (loaders map
transformers 5's `model.language_model.*` to it) and `visual.*` for the vision tower.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import ConfigError, ModelConfig, VisionConfig
from .architecture import Architecture, eos_ids
from .decoder import DecoderLM, PreNormLayer
from .layers import LlamaRMSNorm
from .mrope import MRotary
from .qwen2_5_vl_vision import Qwen2_5_VisionTransformer
from .tiny import qwen2_5_vl as tiny


class Qwen2_5_VLForConditionalGeneration(DecoderLM):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype):
        super().__init__(cfg)
        if cfg.swa_layers:
            raise ValueError("the qwen2_5_vl model has full-attention layers only")
        # Each module casts the tensors it keeps: no converted copy of the whole dict.
        w = weights
        section = cfg.mrope_section or (cfg.head_dim // 2,)
        self.rope = nn.ModuleDict({"full": MRotary(cfg.head_dim, cfg.rope_theta, cfg.max_position,
                                                   section, dtype)})
        self.embed = nn.Parameter(w["model.embed_tokens.weight"].to(dtype), requires_grad=False)
        self.layers = nn.ModuleList(PreNormLayer.load(cfg, i, w, dtype) for i in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, w["model.norm.weight"], dtype)
        self.lm_head = self._head(w, dtype)
        # A text-only checkpoint of this family (no visual.* weights) still serves text.
        vision = cfg.vision if any(k.startswith("visual.") for k in weights) else None
        self.visual = (Qwen2_5_VisionTransformer(vision, weights, dtype) if vision is not None
                       else None)

    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        """Patches of many items -> their embeddings, concatenated in item order
        (`qwen2_5_vl_vision.split_embeds` splits them per item)."""
        if self.visual is None:
            raise ValueError("this checkpoint has no vision tower")
        return self.visual(pixel_values, grid_thw)


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
        bos_token_id=t.get("bos_token_id"), eos_token_ids=eos_ids(t.get("eos_token_id")),
        mrope_section=tuple(rp.get("mrope_section", (16, 24, 24))), attention_bias=True,
        vision=_qwen_vision(c))


ARCHITECTURE = Architecture(
    name="qwen2_5_vl", model_types=("qwen2_5_vl",), hf_config=qwen2_5_vl_config,
    model=Qwen2_5_VLForConditionalGeneration, tiny=tiny.write)
