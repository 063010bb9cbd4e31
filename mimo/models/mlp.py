"""The gated feed-forward block every family uses: down(act(gate(x)) * up(x)), with gate and
up fused into one projection. Also the expert of `moe.SparseMoE`."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import elementwise
from .layers import Linear, stack_rows

# HF `hidden_act` spellings -> the function; gelu_pytorch_tanh is Gemma's.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}


class GatedMLP(nn.Module):
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, act: str = "silu"):
        """gate_up [2I, H] (gate rows first, then up), down [H, I]."""
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r} (known: {', '.join(ACTIVATIONS)})")
        self.gate_up = Linear(gate_up)
        self.down = Linear(down)
        self.act = ACTIVATIONS[act]
        self.act_name = act

    @classmethod
    def load(cls, w: dict, prefix: str, dtype: torch.dtype, act: str = "silu") -> GatedMLP:
        """From HF weights `{prefix}gate_proj`, `up_proj`, `down_proj` (e.g. `model.layers.3.mlp.`)."""
        p = prefix
        mlp = cls(stack_rows([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]], dtype),
                  w[p + "down_proj.weight"].to(dtype), act)
        mlp.gate_up.source = (p + "gate_proj.weight", p + "up_proj.weight")
        mlp.down.source = (p + "down_proj.weight",)
        return mlp

    def input_dtype(self, rows: int) -> torch.dtype | None:
        """What `forward` casts an input of `rows` rows to (see Linear.input_dtype)."""
        return self.gate_up.input_dtype(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        m = elementwise.act_mul(gu, self.act_name)              # the C++ kernel on CPU
        if m is None:
            g, u = gu.chunk(2, dim=-1)
            m = self.act(g) * u
        return self.down(m)
