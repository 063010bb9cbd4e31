"""GGUF file -> (HF-style config dict, HF-named float32 weights).

Quantized tensors are dequantized with the `gguf` package. The family named by the file's
`general.architecture` supplies its tensor names, its metadata reader and whatever undoes
llama.cpp's conventions (Gemma's norms stored as 1 + w, llama's permuted q/k rows), so every
loader yields HF conventions.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from ..cpu.qmatrix import QuantPart, supported
from . import families
from .architecture import GGUFFormat
from .gguf_file import GGUFFile


def open_gguf(path: str | Path) -> GGUFFile:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"model file not found: {p}")
    try:
        return GGUFFile(p)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read GGUF file {p}: {e}") from e


def _format(f: GGUFFile) -> tuple[str, GGUFFormat]:
    """The file's family name and how that family reads GGUF."""
    arch = f.metadata.get("general.architecture")
    formats = families.gguf_formats()
    if arch not in formats:
        raise ValueError(f"GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(formats))})")
    fmt = formats[arch].gguf
    assert fmt is not None, "gguf_formats() lists only families with a GGUF format"
    return formats[arch].name, fmt


def gguf_hf_config(f: GGUFFile) -> dict:
    fmt = _format(f)[1]
    try:
        return fmt.hf_config(f)
    except KeyError as e:
        raise ValueError(f"{f.path}: GGUF metadata lacks {e.args[0]}") from e


def gguf_weights(f: GGUFFile, progress: bool = True) -> dict[str, torch.Tensor]:
    arch, fmt = _format(f)
    out: dict[str, torch.Tensor] = {}
    bar = _progress(len(f.tensors), "loading weights", progress)
    for t in f.tensors.values():
        w = f.dequantize(t)
        name = _hf_name(t.name, arch, fmt.names)
        out[name] = w if fmt.to_hf is None else fmt.to_hf(t.name, w, f.metadata)
        bar.update(1)
    bar.close()
    return out


def gguf_blocks(f: GGUFFile) -> dict[str, QuantPart]:
    """HF name -> the tensor's own quantized blocks, for every 2-D tensor of a type the CPU
    kernels take. A family's conversion to HF conventions is probed on the row numbers: one
    that reorders rows (llama's q/k permutation) reorders the block rows alike; one that
    changes values leaves the tensor with its float copy only."""
    arch, fmt = _format(f)
    out: dict[str, QuantPart] = {}
    for t in f.tensors.values():
        if not supported(t.qtype) or len(t.shape) != 2:
            continue
        data = f.raw(t)
        if fmt.to_hf is not None:
            rows = torch.arange(t.shape[0], dtype=torch.float64)[:, None]
            moved = fmt.to_hf(t.name, rows, f.metadata)
            if moved is not rows:
                order = moved.reshape(-1)
                if moved.shape != rows.shape or not torch.equal(order.sort().values, rows[:, 0]):
                    continue
                data = data.index_select(0, order.long())
        out[_hf_name(t.name, arch, fmt.names)] = QuantPart(data, t.qtype, t.shape[1])
    return out


def _hf_name(name: str, arch: str, names: Mapping[str, str]) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
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
