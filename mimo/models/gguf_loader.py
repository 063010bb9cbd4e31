"""GGUF file -> (HF-style config dict, HF-named float32 weights).

Quantized tensors are dequantized with the `gguf` package. llama.cpp's converter stores
Gemma's norm weights as (1 + w); we undo that so every loader yields HF conventions.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from .gguf_file import GGUFFile

_GEMMA3_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def open_gguf(path: str | Path) -> GGUFFile:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"model file not found: {p}")
    try:
        return GGUFFile(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read GGUF file {p}: {e}") from e


def gguf_hf_config(f: GGUFFile) -> dict:
    md = f.metadata
    arch = md.get("general.architecture")
    if arch != "gemma3":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: gemma3)")
    try:
        a = arch
        hd = int(md[f"{a}.attention.key_length"])
        return {
            "model_type": "gemma3_text", "vocab_size": len(md["tokenizer.ggml.tokens"]),
            "hidden_size": int(md[f"{a}.embedding_length"]),
            "intermediate_size": int(md[f"{a}.feed_forward_length"]),
            "num_hidden_layers": int(md[f"{a}.block_count"]),
            "num_attention_heads": int(md[f"{a}.attention.head_count"]),
            "num_key_value_heads": int(md[f"{a}.attention.head_count_kv"]),
            "head_dim": hd,
            "sliding_window": int(md[f"{a}.attention.sliding_window"]),
            "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
            "rope_theta": float(md.get(f"{a}.rope.freq_base", 1_000_000.0)),
            # Not stored in GGUF; every Gemma 3 checkpoint uses 10k for local layers.
            "rope_local_base_freq": 10_000.0,
            "max_position_embeddings": int(md[f"{a}.context_length"]),
            "query_pre_attn_scalar": hd,
            "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
            "tie_word_embeddings": "output.weight" not in f.tensors,
        }
    except KeyError as e:
        raise ValueError(f"{f.path}: GGUF metadata lacks {e.args[0]}") from e


def gguf_weights(f: GGUFFile, progress: bool = True) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    bar = _progress(len(f.tensors), "loading weights", progress)
    for t in f.tensors.values():
        w = f.dequantize(t)
        name = _hf_name(t.name)
        if name.endswith("norm.weight"):
            w = w - 1.0
        out[name] = w
        bar.update(1)
    bar.close()
    return out


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", name)
    if not m or m.group(2) not in _GEMMA3_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_GEMMA3_NAMES[m.group(2)]}.weight"


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, leave=False)
    except ImportError:
        return _NoBar()
