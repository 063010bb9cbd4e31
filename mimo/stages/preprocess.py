"""preprocess: decoded media -> model inputs (req.decoded -> req.preprocessed): pixel_values
and grid_thw per item plus its embedding-cache key. Model-agnostic: the processor settings
come in as a frozen ProcessorSettings (from the model's vision adapter). The tensors are
made on `device`, the serving device (`--device`), so on a GPU the resize and normalize run
there and the encoder reads them in place; on CPU nothing moves. Tensor work runs in a
thread (torch releases the GIL in its kernels); all images of a request go through one
call, so equal-sized ones are resized as a batch.
"""
from __future__ import annotations

import asyncio

import torch

from ..multimodal.decoded import DecodedMedia
from ..multimodal.embed_cache import digest_key
from ..multimodal.item import MediaItem
from ..multimodal.preprocess import Patches, ProcessorSettings, preprocess_images, preprocess_video
from ..multimodal.preprocessed import PreprocessedMedia
from ..multimodal.video import DecodedVideo
from ..pipeline import Stage
from .chat_request import ChatRequest


class Preprocess(Stage):
    name = "preprocess"

    def __init__(self, settings: ProcessorSettings | None = None,
                 device: str | torch.device = "cpu"):
        super().__init__()
        self.settings = settings or ProcessorSettings()
        self.device = device

    async def process(self, req: ChatRequest) -> None:
        req.preprocessed = await asyncio.to_thread(self._run, req.media, req.decoded)

    def _run(self, items: list[MediaItem], decoded: list[DecodedMedia]
             ) -> list[PreprocessedMedia]:
        s = self.settings
        fp = s.fingerprint()
        image_idx = [i for i, it in enumerate(items) if it.kind == "image"]
        patches: dict[int, Patches] = dict(zip(image_idx, preprocess_images(
            [decoded[i].pixels for i in image_idx], s, self.device)))
        out = []
        for i, it in enumerate(items):
            spg = None
            if it.kind == "video":
                v = decoded[i].pixels
                assert isinstance(v, DecodedVideo), "decode_media makes a DecodedVideo per video"
                patches[i] = preprocess_video(v.frames, s, self.device)
                spg = s.temporal_patch_size / v.sample_fps
            out.append(PreprocessedMedia(it.kind, digest_key(decoded[i].digest, fp,
                                                             it.variant()), patches[i], spg))
        return out
