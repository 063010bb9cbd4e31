"""Multimodal RoPE (Qwen2-VL / Qwen2.5-VL): every token has three positions, (temporal,
height, width). Text tokens have the same value on all three axes, counting up by one; a media
item's tokens share the item's start position, offset by their frame (temporal, scaled to
absolute time for video), row and column on the merged grid. After an item, text continues at
max(position in the item) + 1, so positions grow more slowly than token indices; decoding
continues from there with one fixed offset, `delta` = max + 1 - prompt length.

Text after a video resumes past its last frame's temporal position, as in Qwen's reference
implementation and vLLM. transformers 5.24 resumes at start + max(h, w) / merge instead,
which differs only when a video spans more temporal positions than spatial ones
(tests/models/test_qwen2_5_vl.py shows where).

The rotary frequencies are split in three sections (`mrope_section`, in frequency pairs):
section 0 turns with the temporal position, 1 with the height, 2 with the width.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..config import VisionConfig
from .layers import Rotary


def _grid_positions(start: int, grid: Sequence[int], merge: int, interval: float) -> torch.Tensor:
    t, h, w = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    # float32 then floor, as Qwen's reference does (second_per_grid_ts is a float32 tensor there)
    tt = (torch.arange(t) * torch.tensor(interval, dtype=torch.float32)).long()
    pos = torch.stack(torch.meshgrid(tt, torch.arange(h), torch.arange(w), indexing="ij"))
    return pos.reshape(3, -1) + start


def get_rope_index(input_ids: Sequence[int], vision: VisionConfig,
                   image_grid_thw: Sequence[Sequence[int]] | torch.Tensor | None = None,
                   video_grid_thw: Sequence[Sequence[int]] | torch.Tensor | None = None,
                   second_per_grid_ts: Sequence[float] | None = None,
                   ) -> tuple[torch.Tensor, int]:
    """One prompt's 3-D positions [3, len(input_ids)] and its decode offset `delta` (token i
    >= len(input_ids) has position i + delta on every axis).

    Media items appear in `input_ids` as runs of `image_token_id` / `video_token_id`, one run
    of t*h*w / merge**2 tokens per item, the items of each kind in the order of their grids.
    Video frames are `second_per_grid_ts[i]` seconds apart (default 1) and the temporal axis
    counts `tokens_per_second` per second.
    """
    ids = [int(t) for t in input_ids]
    n = len(ids)
    merge = vision.spatial_merge_size
    grids = {vision.image_token_id: list(image_grid_thw) if image_grid_thw is not None else [],
             vision.video_token_id: list(video_grid_thw) if video_grid_thw is not None else []}
    used = dict.fromkeys(grids, 0)
    secs = list(second_per_grid_ts) if second_per_grid_ts is not None else []
    parts: list[torch.Tensor] = []
    nxt = 0          # the next text position
    i = 0
    while i < n:
        if ids[i] not in grids:
            # A run of text: one position per token, the same on every axis.
            j = i
            while j < n and ids[j] not in grids:
                j += 1
            parts.append(torch.arange(nxt, nxt + j - i).expand(3, -1))
            nxt += j - i
            i = j
            continue
        tok = ids[i]
        kind = "image" if tok == vision.image_token_id else "video"
        k = used[tok]
        if k >= len(grids[tok]):
            raise ValueError(f"more {kind} placeholders than {kind} grids")
        used[tok] += 1
        grid = [int(g) for g in grids[tok][k]]
        count = grid[0] * grid[1] * grid[2] // merge ** 2
        if ids[i:i + count] != [tok] * count:
            raise ValueError(f"{kind} {k} at token {i} needs {count} placeholder tokens in a row")
        if kind == "video":
            interval = vision.tokens_per_second * (float(secs[k]) if k < len(secs) else 1.0)
        else:
            interval = 1.0       # a still image has no time axis to space out
        pos = _grid_positions(nxt, grid, merge, interval)
        parts.append(pos)
        nxt = int(pos.max()) + 1     # text resumes after the item's largest position
        i += count
    for tok, g in grids.items():
        if used[tok] != len(g):
            raise ValueError(f"{len(g)} grids given for token {tok} but {used[tok]} items found")
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.int64)
    return positions, nxt - n


class MRotary(Rotary):
    """Rotate-half RoPE whose frequency pairs follow different position axes. `tables` takes
    positions [3, T] (or [T]: text only, all axes equal) and returns the same (cos, sin)
    layout as `Rotary.tables`, so `Rotary.apply` is unchanged."""

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
