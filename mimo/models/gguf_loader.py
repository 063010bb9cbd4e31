"""GGUF file -> (HF-style config dict, HF-named float32 weights).

Quantized tensors are dequantized with the `gguf` package. llama.cpp's converter stores
Gemma's norm weights as (1 + w), and permutes llama's q/k projection rows (to interleaved
RoPE pairs); we undo both so every loader yields HF conventions.
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
# Same tensors, but llama's ffn_norm is the (only) norm before the MLP.
_LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_NAMES = {"gemma3": _GEMMA3_NAMES, "llama": _LLAMA_NAMES}


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
    if arch not in _NAMES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(_NAMES))})")
    try:
        return _gemma3_config(f) if arch == "gemma3" else _llama_config(f)
    except KeyError as e:
        raise ValueError(f"{f.path}: GGUF metadata lacks {e.args[0]}") from e


def _gemma3_config(f: GGUFFile) -> dict:
    md, a = f.metadata, "gemma3"
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


def _llama_config(f: GGUFFile) -> dict:
    md, a = f.metadata, "llama"
    hidden = int(md[f"{a}.embedding_length"])
    heads = int(md[f"{a}.attention.head_count"])
    kv = md.get(f"{a}.attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise ValueError(f"{f.path}: per-layer KV head counts are not supported")
    hd = int(md.get(f"{a}.attention.key_length", hidden // heads))
    if int(md.get(f"{a}.attention.value_length", hd)) != hd:
        raise ValueError(f"{f.path}: llama with value_length != key_length is not supported")
    if int(md.get(f"{a}.rope.dimension_count", hd)) != hd:
        raise ValueError(f"{f.path}: llama with partial RoPE (rope.dimension_count "
                         f"{md[f'{a}.rope.dimension_count']} != head_dim {hd}) is not supported")
    if int(md.get(f"{a}.expert_count", 0) or 0) > 0:
        raise ValueError(f"{f.path}: mixture-of-experts llama GGUF files are not supported")
    if "rope_freqs.weight" in f.tensors:
        # Llama 3.1+ converters store the llama3 RoPE scaling as per-frequency factors.
        raise ValueError(f"{f.path}: llama3-style RoPE scaling (rope_freqs) is not supported")
    rope: dict = {"rope_type": "default"}
    kind = md.get(f"{a}.rope.scaling.type", "none")
    if kind == "linear":
        rope = {"rope_type": "linear", "factor": float(md[f"{a}.rope.scaling.factor"])}
    elif kind != "none":
        raise ValueError(f"{f.path}: llama RoPE scaling {kind!r} is not supported "
                         f"(supported: none, linear)")
    rope["rope_theta"] = float(md.get(f"{a}.rope.freq_base", 10_000.0))
    return {
        "model_type": "llama",
        "vocab_size": int(md.get(f"{a}.vocab_size", len(md["tokenizer.ggml.tokens"]))),
        "hidden_size": hidden,
        "intermediate_size": int(md[f"{a}.feed_forward_length"]),
        "num_hidden_layers": int(md[f"{a}.block_count"]),
        "num_attention_heads": heads, "num_key_value_heads": int(kv), "head_dim": hd,
        "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_parameters": rope,
        "max_position_embeddings": int(md[f"{a}.context_length"]),
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "tie_word_embeddings": "output.weight" not in f.tensors,
    }


def gguf_weights(f: GGUFFile, progress: bool = True) -> dict[str, torch.Tensor]:
    md = f.metadata
    arch = md.get("general.architecture")
    if arch not in _NAMES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(_NAMES))})")
    out: dict[str, torch.Tensor] = {}
    bar = _progress(len(f.tensors), "loading weights", progress)
    for t in f.tensors.values():
        w = f.dequantize(t)
        name = _hf_name(t.name, arch)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0
        elif arch == "llama" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = int(md["llama.attention.head_count"])
            if t.name.endswith(".attn_k.weight"):
                heads = int(md.get("llama.attention.head_count_kv", heads))
            w = _unpermute_qk(w, heads)
        out[name] = w
        bar.update(1)
    bar.close()
    return out


def _unpermute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's `permute` of a q/k projection: within each head it reorders rows from
    HF's rotate-half layout (first half, second half) to interleaved pairs. Same as
    transformers' `LlamaTensorProcessor._reverse_permute_weights`."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _hf_name(name: str, arch: str = "gemma3") -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    names = _NAMES[arch]
    m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", name)
    if not m or m.group(2) not in names:
        raise ValueError(f"unexpected GGUF tensor {name!r} for architecture {arch!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.weight"


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
