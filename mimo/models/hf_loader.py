"""Hugging Face directory (config.json + *.safetensors) -> HF-named float32 weights."""
from __future__ import annotations

from pathlib import Path

import torch

from .gguf_loader import _progress

# Multimodal wrappers nest the text model; the text model's names are canonical here.
_PREFIXES = ("language_model.", "model.language_model.")


def _canonical(name: str) -> str:
    if name.startswith("model.visual."):      # transformers 5's Qwen2.5-VL vision tower
        return name[len("model."):]
    for p in _PREFIXES:
        if name.startswith(p):
            rest = name[len(p):]
            return rest if rest.startswith(("model.", "lm_head.")) else "model." + rest
    return name


def hf_weights(path: Path, progress: bool = True) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    out: dict[str, torch.Tensor] = {}
    names = []
    for f in files:
        with safe_open(str(f), "pt") as h:
            names += [(f, k) for k in h.keys()]
    bar = _progress(len(names), "loading weights", progress)
    handles = {}
    try:
        for f, k in names:
            if f not in handles:
                handles[f] = safe_open(str(f), "pt").__enter__()
            if "vision" in k or "multi_modal_projector" in k:
                bar.update(1)
                continue
            out[_canonical(k)] = handles[f].get_tensor(k).float()
            bar.update(1)
    finally:
        bar.close()
    return out
