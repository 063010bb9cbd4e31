"""Hugging Face config.json -> ModelConfig: the family whose `model_type` it is reads it
(each family's module declares its reader in its `ARCHITECTURE`); what holds for every
family (quantized checkpoints refused, preprocessor settings) is here."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..config import ConfigError, ModelConfig, VisionConfig
from . import families


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    mt = c.get("model_type")
    arch = families.by_model_type(mt) if isinstance(mt, str) else None
    if arch is None:
        raise ConfigError(f"unsupported model_type {mt!r}; supported: {', '.join(families.model_types())}")
    _refuse_quantized(c)
    return arch.hf_config(c)


def _refuse_quantized(c: dict[str, Any]) -> None:
    """Weights are read as plain floats: a quantized checkpoint (FP8 block-quantized
    MiMo-V2-Flash, GPTQ, AWQ, ...) would load as garbage, so it is refused by name."""
    q = c.get("quantization_config")
    if not q:
        return
    method = q.get("quant_method", "unknown") if isinstance(q, dict) else "unknown"
    detail = ""
    if isinstance(q, dict) and (q.get("fmt") or q.get("weight_block_size")):
        detail = f" (fmt={q.get('fmt')!r}, weight_block_size={q.get('weight_block_size')!r})"
    raise ConfigError(
        f"this checkpoint's weights are quantized: quantization_config.quant_method="
        f"{method!r}{detail}. This build runs bfloat16/float32 weights only (there is no "
        f"{method} kernel on this device); use a bf16 checkpoint or dequantize it first")


def vision_preprocessing(vision: VisionConfig, pre: dict[str, Any]) -> VisionConfig:
    """`vision` with the image preprocessing of a checkpoint's preprocessor_config.json
    (Qwen2VLImageProcessor: `min_pixels` / `max_pixels`, or transformers 5's
    `size.shortest_edge` / `size.longest_edge`; `image_mean`, `image_std`). Its patch
    geometry must be the vision tower's: a mismatch means a broken checkpoint."""
    if not isinstance(pre, dict):
        raise ConfigError("preprocessor_config.json must hold a JSON object")
    for key, ours in (("patch_size", vision.patch_size), ("merge_size", vision.spatial_merge_size),
                      ("temporal_patch_size", vision.temporal_patch_size)):
        if key in pre and pre[key] != ours:
            raise ConfigError(f"preprocessor_config.json has {key}={pre[key]!r} but the "
                              f"vision tower's config.json says {ours}")
    size = pre.get("size")
    if not isinstance(size, dict):
        size = {}
    lo = pre.get("min_pixels", size.get("shortest_edge", vision.min_pixels))
    hi = pre.get("max_pixels", size.get("longest_edge", vision.max_pixels))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 0 < lo <= hi:
        raise ConfigError(f"preprocessor_config.json pixel bounds must be integers with "
                          f"0 < min_pixels <= max_pixels, not {lo!r} and {hi!r}")
    out: dict[str, Any] = {"min_pixels": lo, "max_pixels": hi}
    for key in ("image_mean", "image_std"):
        v = pre.get(key, getattr(vision, key))
        if (not isinstance(v, (list, tuple)) or len(v) != 3
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise ConfigError(f"preprocessor_config.json {key} must be 3 numbers, not {v!r}")
        out[key] = tuple(float(x) for x in v)
    if min(out["image_std"]) <= 0:
        raise ConfigError("preprocessor_config.json image_std must be > 0")
    return dataclasses.replace(vision, **out)
