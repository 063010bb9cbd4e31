"""One C++ call per decoder layer for the decode steps the CPU kernels serve.

A decode step of a small model is mostly per-layer overhead when each layer runs as Python
modules: about thirty module calls, casts, views and small aten ops around four products
(docs/speed.md). `fuse_layer` hands a built layer's weights (its GGUF or Q8_0 blocks, its
norm scales, its head shapes) to `DecodeLayer` (mimo/cpu/csrc/decode_layer.cpp), which runs
the whole layer, rounding where the plain layer rounds to its dtype.

The plain layer stays the model: it runs prefill, the GPU, every layer that `fuse_layer`
declines, and every step that `step_fits` declines. A fused layer reads the same weights,
the same caches and the same `AttnBatch`.
"""
from __future__ import annotations

from typing import Any

import torch

from ..gpu.attention import AttentionBackend, AttnBatch, TorchAttention
from .attention import Attention
from .layers import QUANT_MAX_ROWS, Linear, RMSNorm, Rotary
from .mlp import GatedMLP

_ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}
_EMPTY = torch.empty(0)


def _blocks(lin: Linear) -> tuple[list[torch.Tensor], list[int]] | None:
    if lin.qweight is None:
        return None
    return [p.data for p in lin.qweight.parts], [p.qtype for p in lin.qweight.parts]


def _norms(layer: Any) -> list[RMSNorm] | None:
    """(input, post-attention, pre-MLP, post-MLP) norms: Gemma 3's sandwich, or the pre-norm
    shape (whose second norm runs before the MLP; its norms on the float32 residual stream
    are rms_norm(x, w), the sandwich form with scale w)."""
    names = ("input_norm", "post_attn_norm", "pre_ff_norm", "post_ff_norm")
    if all(hasattr(layer, n) for n in names):
        return [getattr(layer, n) for n in names]
    if hasattr(layer, "input_norm") and hasattr(layer, "post_attn_norm"):
        return [layer.input_norm, None, layer.post_attn_norm, None]
    return None


def fuse_layer(ops: Any, layer: Any, rope: Rotary) -> Any | None:
    """The `DecodeLayer` for `layer`, or None when it has a part the C++ layer does not
    run: a non-dense MLP (MoE), a projection without blocks, a q/k/v bias, norms of other
    kinds or epsilons, a dtype other than bf16/float32, more query heads per KV head than
    its attention takes (`ops.max_rep`)."""
    attn, mlp = getattr(layer, "attn", None), getattr(layer, "mlp", None)
    norms = _norms(layer)
    if not isinstance(attn, Attention) or not isinstance(mlp, GatedMLP) or norms is None:
        return None
    if attn.hq % attn.hkv or attn.hq // attn.hkv > ops.max_rep:
        return None
    if attn.qkv_bias is not None or rope.cos.shape[-1] > attn.d:
        return None
    dtype = attn.qkv.weight.dtype
    if dtype not in (torch.bfloat16, torch.float32) or mlp.act_name not in _ACTS:
        return None
    eps = {n.eps for n in norms if n is not None}
    if attn.qk_norm is not None:
        eps.add(attn.qk_norm.eps)
    if len(eps) != 1 or any(n is not None and n.scale.dim() != 1 for n in norms):
        return None
    parts = [_blocks(lin) for lin in (attn.qkv, attn.o, mlp.gate_up, mlp.down)]
    if any(p is None for p in parts):
        return None
    qk = attn.qk_norm.scale if attn.qk_norm is not None else _EMPTY
    sinks = attn.sinks if attn.sinks is not None else _EMPTY
    args = [x for p in parts if p is not None for x in p]
    return ops.DecodeLayer(*args, [n.scale if n is not None else _EMPTY for n in norms], qk,
                           sinks, attn.hq, attn.hkv, attn.d, attn.dv, rope.cos.shape[-1],
                           eps.pop(), float(attn.scale), float(attn.v_scale),
                           _ACTS[mlp.act_name], dtype == torch.bfloat16)


def step_fits(x: torch.Tensor, batches: dict[str, AttnBatch],
              backend: AttentionBackend) -> bool:
    """Whether this step may run the fused layers: a few decode rows on the CPU, every row
    written, over a backend that reads the caches by `AttnBatch` slots."""
    if x.shape[0] > QUANT_MAX_ROWS or x.device.type != "cpu" or backend.paged \
            or not isinstance(backend, TorchAttention):
        return False
    return all(b.all_decode and b.write_rows is None and b.decode_lens is not None
               for b in batches.values())


def float_tables(tables: dict[str, tuple[torch.Tensor, torch.Tensor]]
                 ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each kind's RoPE tables in float32, once a step: the C++ layer reads float32, and
    a bf16 table would be converted by every layer of its kind (36 small aten ops a step
    for Gemma 3 270M). The values are the same: every bf16 is a float32."""
    return {k: (c.float(), s.float()) for k, (c, s) in tables.items()}


def run(fused: Any, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor, v_cache: torch.Tensor, b: AttnBatch) -> torch.Tensor:
    return fused.forward(x, tables[0], tables[1], k_cache, v_cache, b.write_slots,
                         b.decode_slots, b.decode_lens)
