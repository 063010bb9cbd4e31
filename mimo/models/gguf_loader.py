"""GGUF file -> (HF-style config dict, HF-named weights).

Quantized tensors are dequantized as the `gguf` package does (gguf_dequant.py). The family
named by the file's `general.architecture` supplies its tensor names, its metadata reader and
whatever undoes llama.cpp's conventions (Gemma's norms stored as 1 + w, llama's permuted q/k rows), so every
loader yields HF conventions.
"""
from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch

from ..cpu import extension
from ..cpu.qmatrix import QuantPart, supported
from . import families, gguf_dequant
from .architecture import GGUFFormat
from .gguf_file import GGUFFile, GGUFTensor
from .layers import STACKED_ROWS


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


class DenseStart:
    """Matrices of a GGUF decoding into their slots on the kernel extension's own thread,
    which holds no GIL (`start_dense`); `gguf_weights` takes them as done once `wait`
    returned. Wait before the file is closed: the thread reads its mapped bytes."""

    def __init__(self, handle: Any, names: frozenset[str]):
        self._handle, self.names = handle, names

    def wait(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.wait()


def start_dense(f: GGUFFile, dtype: torch.dtype, slots: dict[str, torch.Tensor]
                ) -> DenseStart | None:
    """Start decoding every matrix of `f` that needs no conversion to HF conventions, is of a
    type the extension decodes and has a slot, straight into that slot in `dtype` (float32
    or bfloat16), bit for bit as `gguf_weights` would; None where the kernel extension is not
    loaded in this process (it is never built for this) or takes none of them."""
    ext = extension.loaded()
    if ext is None or dtype not in (torch.float32, torch.bfloat16):
        return None
    arch, fmt = _format(f)
    src, types, out, names = [], [], [], []
    with warnings.catch_warnings():          # read-only views of the mapped file: only read
        warnings.simplefilter("ignore", UserWarning)
        for t in f.tensors.values():
            name = _hf_name(t.name, arch, fmt.names)
            if name not in slots or not ext.dequant_type(t.qtype) or len(t.shape) < 2 \
                    or _row_order(fmt, t, f.metadata) is not True:
                continue
            src.append(torch.frombuffer(f.mapped(), dtype=torch.uint8, count=t.nbytes,
                                        offset=t.offset))
            types.append(t.qtype)
            out.append(slots[name])
            names.append(name)
    if not names:
        return None
    return DenseStart(ext.start_dequantize(src, types, out), frozenset(names))


def gguf_weights(f: GGUFFile, progress: bool = True, dtype: torch.dtype = torch.float32,
                 slots: dict[str, torch.Tensor] | None = None,
                 started: DenseStart | None = None) -> dict[str, torch.Tensor]:
    """HF name -> weight. Matrices (2-D and up) come in `dtype`, the one the model is built
    in (every family casts its matrices to it; dequantizing straight to it skips a float32
    copy of each), unless the family's conversion to HF conventions changes their values:
    those convert in float32, then cast. Vectors (norms, biases) stay float32. The matrices
    are written to `slots` (default: `weight_slots`'); those `started` (`start_dense`, on
    the same slots) are waited for and taken as they are."""
    arch, fmt = _format(f)
    named = {_hf_name(t.name, arch, fmt.names): t for t in f.tensors.values()}
    if slots is None:
        slots = weight_slots(f, dtype)[1]
    order, done = list(named), {}
    if started is not None:
        started.wait()
        done = {name: slots[name] for name in started.names}
        named = {name: t for name, t in named.items() if name not in done}
    bar = _progress(len(named), "loading weights", progress)
    # As many threads as torch has intra-op threads, each running its ops on one: the
    # tensors, not each op's elements, spread over the cores (torch ops release the GIL).
    n = torch.get_num_threads()
    with gguf_dequant.one_thread(), ThreadPoolExecutor(n, thread_name_prefix="mimo-load") as pool:
        futures = {pool.submit(_weight, f, fmt, t, dtype, slots.get(name)): name
                   for name, t in named.items()}
        for fut in as_completed(futures):
            fut.result()                    # the first error, as soon as it happens
            bar.update(1)
    bar.close()
    done.update((name, fut.result()) for fut, name in futures.items())
    return {name: done[name] for name in order}


def weight_slots(f: GGUFFile, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One buffer for every matrix `gguf_weights` writes, and each one's view of it (HF name
    -> view): the members of each group of layers.STACKED_ROWS adjacent and in order, so
    that the model's `stack_rows` takes a group without a copy. One allocation, whose pages
    a thread can touch ahead of the writes (registry.load)."""
    arch, fmt = _format(f)
    named = {_hf_name(t.name, arch, fmt.names): t for t in f.tensors.values()}
    runs: list[list[str]] = []                 # names laid out together, in order
    placed: set[str] = set()
    for name, t in named.items():
        if len(t.shape) < 2 or name in placed:
            continue
        run = [name]
        m = re.match(r"(model\.layers\.\d+\.)(.+)\.weight$", name)
        prefix, own = m.groups() if m else ("", "")
        for group in STACKED_ROWS:
            members = [f"{prefix}{g}.weight" for g in group]
            if own in group and all(n in named and len(named[n].shape) == 2
                                    and named[n].shape[1] == t.shape[1] for n in members):
                run = members
        runs.append(run)
        placed.update(run)
    align = max(1, 64 // torch.empty(0, dtype=dtype).element_size())   # 64-byte starts
    sizes = [sum(math.prod(named[n].shape) for n in run) for run in runs]
    buf = torch.empty(sum(-(-k // align) * align for k in sizes), dtype=dtype)
    slots, at = {}, 0
    for run, k in zip(runs, sizes):
        for n in run:
            shape = named[n].shape
            slots[n] = buf[at:at + math.prod(shape)].view(shape)
            at += math.prod(shape)
        at += -(-k // align) * align - k
    return buf, slots


def _weight(f: GGUFFile, fmt: GGUFFormat, t: GGUFTensor, dtype: torch.dtype,
            slot: torch.Tensor | None) -> torch.Tensor:
    """The tensor in HF conventions; matrices in `dtype`, written to `slot` if given."""
    if len(t.shape) < 2:
        return _to_hf(fmt, t, f.dequantize(t), f.metadata)
    order = _row_order(fmt, t, f.metadata)
    if order is True:
        return f.dequantize(t, dtype, slot)
    if order is not None:                   # reordering rows is exact in any dtype
        w = _to_hf(fmt, t, f.dequantize(t, dtype), f.metadata)
    else:
        w = _to_hf(fmt, t, f.dequantize(t), f.metadata).to(dtype)
    return w if slot is None else slot.copy_(w)


def _to_hf(fmt: GGUFFormat, t: GGUFTensor, w: torch.Tensor, md: Mapping) -> torch.Tensor:
    return w if fmt.to_hf is None else fmt.to_hf(t.name, w, md)


def gguf_blocks(f: GGUFFile) -> dict[str, QuantPart]:
    """HF name -> the tensor's own quantized blocks, for every 2-D tensor of a type the CPU
    kernels take. A family's conversion to HF conventions that reorders rows (llama's q/k
    permutation) reorders the block rows alike; one that changes values leaves the tensor
    with its float copy only."""
    arch, fmt = _format(f)
    out: dict[str, QuantPart] = {}
    for t in f.tensors.values():
        if not supported(t.qtype) or len(t.shape) != 2:
            continue
        order = _row_order(fmt, t, f.metadata)
        if order is None:
            continue
        data = f.raw(t)
        if not isinstance(order, bool):
            data = data.index_select(0, order)
        out[_hf_name(t.name, arch, fmt.names)] = QuantPart(data, t.qtype, t.shape[1])
    return out


def _row_order(fmt: GGUFFormat, t: GGUFTensor, md: Mapping) -> torch.Tensor | bool | None:
    """What the family's conversion to HF conventions does to a 2-D tensor, probed on the
    row numbers: True (nothing), the new row order (a permutation of rows), or None
    (it changes values)."""
    if fmt.to_hf is None:
        return True
    rows = torch.arange(t.shape[0], dtype=torch.float64)[:, None]
    moved = fmt.to_hf(t.name, rows, md)
    if moved is rows:
        return True
    order = moved.reshape(-1)
    if moved.shape != rows.shape or not torch.equal(order.sort().values, rows[:, 0]):
        return None
    return order.long()


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
