"""mm_prompt: token ids with one pad token per media item + the encoder's embeddings ->
the expanded prompt ids and the engine's `MMPrompt`.

Each image's or video's single placeholder pad token becomes t*h*w / merge**2 pad tokens
(its grid after preprocessing), as Hugging Face's processor expands them, so every
embedding row has a token to replace. The prompt's `cache_key` hashes the items' keys in
prompt order: the prefix cache then shares KV only between prompts with the same media in
the same places (placeholder ids alone are identical for any picture).
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Sequence

import torch

from ..config import VisionConfig
from ..engine.mm_prompt import MMPrompt
from ..pipeline import InvalidRequest, Stage


def expand_placeholders(ids: Sequence[int], vision: VisionConfig, kinds: Sequence[str],
                        counts: Sequence[int]) -> list[int]:
    """Replace the k-th pad token (image or video) by counts[k] copies; kinds[k] must be
    its kind. InvalidRequest when pads and items do not pair up."""
    pad = {vision.image_token_id: "image", vision.video_token_id: "video"}
    out: list[int] = []
    k = 0
    for tok in ids:
        kind = pad.get(tok)
        if kind is None:
            out.append(tok)
            continue
        if k >= len(kinds) or kinds[k] != kind:
            got = "nothing" if k >= len(kinds) else f"a {kinds[k]}"
            raise InvalidRequest(f"the prompt's media placeholder {k + 1} is for a {kind}, but "
                                 f"the request's media item {k + 1} is {got} (media placeholder "
                                 f"tokens in the text are not allowed)")
        out.extend([tok] * counts[k])
        k += 1
    if k != len(kinds):
        raise InvalidRequest(f"the prompt has {k} media placeholders for {len(kinds)} media items")
    return out


def media_cache_key(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def build_prompt(ids: Sequence[int], vision: VisionConfig, media: Sequence,
                 embeds: Sequence[torch.Tensor]) -> tuple[list[int], MMPrompt]:
    """`media`: the preprocess stage's PreprocessedMedia, `embeds` the encoder's output for
    each, both in prompt order."""
    merge = vision.spatial_merge_size ** 2
    kinds = [m.kind for m in media]
    grids = [list(m.patches.grid_thw) for m in media]
    full = expand_placeholders(ids, vision, kinds,
                               [t * h * w // merge for t, h, w in grids])
    pick = lambda kind, xs: [x for x, m in zip(xs, media) if m.kind == kind]  # noqa: E731
    videos = pick("video", media)
    mmp = MMPrompt.build(
        full, vision, image_embeds=pick("image", embeds),
        image_grid_thw=pick("image", grids) or None,
        video_embeds=pick("video", embeds), video_grid_thw=pick("video", grids) or None,
        second_per_grid_ts=[m.second_per_grid for m in videos] or None)
    mmp.cache_key = media_cache_key([m.key for m in media])
    return full, mmp


class MMPromptStage(Stage):
    """Returns (prompt ids, MMPrompt | None); None for a request without media."""
    name = "mm_prompt"

    def __init__(self, vision: VisionConfig):
        super().__init__()
        self.vision = vision

    async def process(self, req):
        ids = req.data["tokenize"]
        media = req.data.get("preprocess") or []
        if not media:
            # No items: any pad token in the ids came from the text and has nothing to show.
            expand_placeholders(ids, self.vision, [], [])
            return list(ids), None
        try:
            return await asyncio.to_thread(build_prompt, ids, self.vision, media,
                                           req.data["encode"])
        except ValueError as e:      # MMPrompt's own consistency checks
            raise InvalidRequest(str(e)) from e
