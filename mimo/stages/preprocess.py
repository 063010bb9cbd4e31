"""preprocess: decoded media -> model inputs (pixel_values, grid_thw) plus each item's
embedding-cache key. Model-agnostic: the processor settings come in as a frozen
ProcessorSettings (from the model's vision adapter). The tensors are made on `device`, the
serving device (`--device`), so on a GPU the resize and normalize run there and the encoder
reads them in place; on CPU nothing moves. Tensor work runs in a thread (torch releases the
GIL in its kernels); all images of a request go through one call, so equal-sized ones are
resized as a batch.
"""
from __future__ import annotations

import asyncio

import torch

from ..multimodal.embed_cache import media_key
from ..multimodal.errors import MediaError
from ..multimodal.preprocess import Patches, ProcessorSettings, preprocess_images, preprocess_video
from ..multimodal.preprocessed import PreprocessedMedia
from ..pipeline import InvalidRequest, Stage
from .media_items import request_items


class Preprocess(Stage):
    name = "preprocess"

    def __init__(self, settings: ProcessorSettings = ProcessorSettings(),
                 device: str | torch.device = "cpu"):
        super().__init__()
        self.settings = settings
        self.device = device

    async def process(self, req):
        items = request_items(req.data)
        try:
            return await asyncio.to_thread(self._run, items, req.data["fetch"],
                                           req.data["decode_media"])
        except MediaError as e:
            raise InvalidRequest(str(e)) from e

    def _run(self, items, blobs, decoded) -> list[PreprocessedMedia]:
        s = self.settings
        fp = s.fingerprint()
        image_idx = [i for i, it in enumerate(items) if it.kind == "image"]
        patches: dict[int, Patches] = dict(zip(
            image_idx, preprocess_images([decoded[i] for i in image_idx], s, self.device)))
        out = []
        for i, it in enumerate(items):
            spg = None
            if it.kind == "video":
                v = decoded[i]
                patches[i] = preprocess_video(v.frames, s, self.device)
                spg = s.temporal_patch_size / v.sample_fps
            out.append(PreprocessedMedia(it.kind, media_key(blobs[i], fp, it.variant()),
                                         patches[i], spg))
        return out
