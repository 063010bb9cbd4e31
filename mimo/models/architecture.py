"""What a model family declares about itself, in one `Architecture` value that its module
exposes as `ARCHITECTURE` (`families.py` collects them): how its Hugging Face config reads
into a `ModelConfig`, how its GGUF files map to HF names, the model class, and its tiny
checkpoint writer. The loaders (registry, hf_config, gguf_loader, make_tiny) name no family:
they look it up."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ModelConfig
from .gguf_file import GGUFFile

# llama.cpp's names of a decoder layer's tensors (blk.{i}.<name>.weight) that every family
# spells alike; a family adds its own norms (whose meaning differs between families).
GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class GGUFFormat:
    """A family's GGUF files (their `general.architecture` is the family's name)."""
    # blk.{i}.<key>.weight -> model.layers.{i}.<value>.weight
    names: Mapping[str, str]
    # the file's metadata (and tensor list) -> a config.json dict for the family's `hf_config`
    hf_config: Callable[[GGUFFile], dict[str, Any]]
    # (GGUF tensor name, dequantized tensor, metadata) -> the tensor in HF's convention
    to_hf: Callable[[str, torch.Tensor, Mapping[str, Any]], torch.Tensor] | None = None


@dataclass(frozen=True)
class Architecture:
    name: str                                         # ModelConfig.arch
    model_types: tuple[str, ...]                      # config.json `model_type` values read
    hf_config: Callable[[dict[str, Any]], ModelConfig]
    model: Callable[[ModelConfig, dict[str, torch.Tensor], torch.dtype], nn.Module]
    gguf: GGUFFormat | None = None
    tiny: Callable[[Path, int], None] | None = None   # `make_tiny ARCH DIR` writer
    # what the loaded weights decide over the config (MiMo: how many MTP layers there are)
    from_weights: Callable[[ModelConfig, dict[str, torch.Tensor]], ModelConfig] | None = None


def eos_ids(v) -> tuple[int, ...]:
    """config.json's `eos_token_id`: absent, one id or a list."""
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v),)
