"""Qwen2.5-VL (and Qwen2-VL, MiMo-VL: same layout) as a vision family: placeholders
`<|vision_start|><|image_pad|><|vision_end|>` (one pad token per merged 2x2 patch after
expansion), the checkpoint's processor settings, multimodal RoPE positions, and the
window-attention ViT of models/qwen2_5_vl_vision.py as the tower.

Multimodal RoPE positions: every token has three, (temporal, height, width). Text tokens
have the same value on all three axes, counting up by one; a media item's tokens share the
item's start position, offset by their frame (temporal, scaled to absolute time for video),
row and column on the merged grid. After an item, text continues at max(position in the
item) + 1, so positions grow more slowly than token indices; decoding continues from there
with one fixed offset, `delta` = max + 1 - prompt length.

Text after a video resumes past its last frame's temporal position, as in Qwen's reference
implementation and vLLM. transformers 5.24 resumes at start + max(h, w) / merge instead,
which differs only when a video spans more temporal positions than spatial ones
(tests/models/test_qwen2_5_vl.py shows where). The rotary side (which frequencies turn with
which axis) is the model's: models/mrope.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ...config import ConfigError, VisionConfig
from ..adapter import VisionAdapter, register_adapter
from ..config import MediaConfig
from ..mm_prompt import MMPrompt
from ..preprocess import ProcessorSettings
from ..preprocessed import PreprocessedMedia


def _grid_positions(start: int, grid: Sequence[int], merge: int, interval: float) -> torch.Tensor:
    t, h, w = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
    # float32 then floor, as Qwen's reference does (second_per_grid_ts is a float32 tensor there)
    tt = (torch.arange(t) * torch.tensor(interval, dtype=torch.float32)).long()
    pos = torch.stack(torch.meshgrid(tt, torch.arange(h), torch.arange(w), indexing="ij"))
    return pos.reshape(3, -1) + start


def pad_tokens(vision: VisionConfig) -> tuple[int, int]:
    """The image and video placeholder ids, which every config of this family names."""
    if vision.image_token_id is None or vision.video_token_id is None:
        raise ConfigError("a qwen2_5_vl vision config needs image_token_id and video_token_id")
    return vision.image_token_id, vision.video_token_id


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
    image_pad, video_pad = pad_tokens(vision)
    grids = {image_pad: list(image_grid_thw) if image_grid_thw is not None else [],
             video_pad: list(video_grid_thw) if video_grid_thw is not None else []}
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
        kind = "image" if tok == image_pad else "video"
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


@register_adapter
class Qwen2_5_VLAdapter(VisionAdapter):
    arch = "qwen2_5_vl"

    def placeholder_text(self, tokenizer, kind: str) -> str:
        """What Qwen2.5-VL's chat template writes for an image or a video part."""
        tok = tokenizer.id_to_token
        v = self.vision
        return tok(v.vision_start_token_id) + tok(self.pad_token(kind)) + tok(v.vision_end_token_id)

    def pad_token(self, kind: str) -> int:
        image_pad, video_pad = pad_tokens(self.vision)
        return image_pad if kind == "image" else video_pad

    def rope_index(self, prompt_ids: Sequence[int], media: Sequence[PreprocessedMedia]
                   ) -> tuple[torch.Tensor, int]:
        grids = {k: [list(m.patches.grid_thw) for m in media if m.kind == k]
                 for k in ("image", "video")}
        secs: list[float] = []
        for m in media:
            if m.kind == "video":
                assert m.second_per_grid is not None, "preprocessing times every video's grid"
                secs.append(m.second_per_grid)
        return get_rope_index(prompt_ids, self.vision, grids["image"] or None,
                              grids["video"] or None, secs or None)

    def processor_settings(self, media: MediaConfig = MediaConfig()) -> ProcessorSettings:
        """The checkpoint's image preprocessing (patch geometry, pixel bounds,
        normalization), its upper pixel bound lowered to `media.resize_max_pixels` when
        that is set."""
        return processor_settings(self.vision, media)

    def build_tower(self, weights: dict, dtype: torch.dtype) -> torch.nn.Module:
        from ...models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer
        return Qwen2_5_VisionTransformer(self.vision, weights, dtype)


def processor_settings(vision: VisionConfig, media: MediaConfig = MediaConfig()
                       ) -> ProcessorSettings:
    hi = vision.max_pixels
    if media.resize_max_pixels is not None:
        hi = min(hi, media.resize_max_pixels)
        if hi < vision.min_pixels:
            raise ConfigError(f"resize_max_pixels={media.resize_max_pixels} is below the "
                              f"checkpoint's min_pixels={vision.min_pixels}")
    return ProcessorSettings(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                             temporal_patch_size=vision.temporal_patch_size,
                             min_pixels=vision.min_pixels, max_pixels=hi,
                             image_mean=vision.image_mean, image_std=vision.image_std)


def build_mm_prompt(prompt_ids: Sequence[int], vision: VisionConfig,
                    image_embeds: Sequence[torch.Tensor] = (), image_grid_thw=None,
                    video_embeds: Sequence[torch.Tensor] = (), video_grid_thw=None,
                    second_per_grid_ts: Sequence[float] | None = None) -> MMPrompt:
    """An MMPrompt from an already expanded prompt in Hugging Face's argument layout
    (images and videos each in prompt order, one embedding row per placeholder token), as
    the model tests build one against transformers."""
    positions, delta = get_rope_index(prompt_ids, vision, image_grid_thw, video_grid_thw,
                                      second_per_grid_ts)
    image_pad, video_pad = pad_tokens(vision)
    return MMPrompt.assemble(prompt_ids, positions, delta,
                             {image_pad: list(image_embeds), video_pad: list(video_embeds)})
