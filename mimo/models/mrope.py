"""Multimodal RoPE (Qwen2-VL / Qwen2.5-VL), the rotary side: every token has three
positions, (temporal, height, width), and the rotary frequencies are split in three sections
(`mrope_section`, in frequency pairs): section 0 turns with the temporal position, 1 with
the height, 2 with the width. Where the positions come from (media grids, video time) is
the vision family's rule: mimo/multimodal/adapters/qwen2_5_vl.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .layers import Rotary


class MRotary(Rotary):
    """Rotate-half RoPE whose frequency pairs follow different position axes. `tables` takes
    positions [3, T] (or [T]: text only, all axes equal) and returns the same (cos, sin)
    layout as `Rotary.tables`, so `Rotary.rotate` is unchanged."""

    axis: torch.Tensor    # buffer [dim]: the position axis each table column follows

    def __init__(self, dim: int, theta: float, max_pos: int, section: Sequence[int],
                 dtype: torch.dtype = torch.float32):
        super().__init__(dim, theta, max_pos, dtype=dtype)
        axis = torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section))
        if len(axis) * 2 != dim:
            raise ValueError(f"mrope_section {tuple(section)} must sum to {dim // 2}")
        # Column c of the table (both halves) uses the position of axis[c mod dim/2].
        self.register_buffer("axis", torch.cat([axis, axis]), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().tables(positions)
        idx = positions.index_select(0, self.axis).t()           # [T, dim]: position per column
        return (self.cos.gather(0, idx).unsqueeze(1), self.sin.gather(0, idx).unsqueeze(1))
