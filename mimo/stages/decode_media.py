"""decode_media: fetched bytes -> RGB frames (req.fetched -> req.decoded), images in a
process pool, videos by parallel chunk readers: in item order, a DecodedMedia holding an
ndarray [H, W, 3] per image and a DecodedVideo per video, with the digest of its bytes."""
from __future__ import annotations

import asyncio

import numpy as np

from ..multimodal.config import MediaConfig
from ..multimodal.decoded import DecodedMedia
from ..multimodal.embed_cache import content_digest
from ..multimodal.image import ImageDecoder
from ..multimodal.item import MediaItem
from ..multimodal.video import DecodedVideo, VideoDecoder
from ..pipeline import Stage
from .chat_request import ChatRequest
from .media_items import gather_items


class DecodeMedia(Stage):
    name = "decode_media"

    def __init__(self, cfg: MediaConfig | None = None, *,
                 images: ImageDecoder | None = None, videos: VideoDecoder | None = None):
        super().__init__()
        cfg = cfg or MediaConfig()
        # Decoders passed in are shared with others and stay open; our own close with us.
        self._own = (images is None, videos is None)
        self.images = images or ImageDecoder(cfg.decode_workers, cfg.max_image_pixels)
        self.videos = videos or VideoDecoder.from_config(cfg)

    async def process(self, req: ChatRequest) -> None:
        blobs = req.fetched

        async def one(i, it):
            # Hashing a large video takes a while: beside the decode, off the loop.
            px, digest = await asyncio.gather(self._pixels(blobs[i], it),
                                              asyncio.to_thread(content_digest, blobs[i]))
            return DecodedMedia(it.kind, px, digest)
        req.decoded = await gather_items(req.media, one)

    async def _pixels(self, blob: bytes, it: MediaItem) -> np.ndarray | DecodedVideo:
        if it.kind == "image":
            return await self.images.decode(blob)
        return await self.videos.decode(blob, stream=it.stream, fps=it.fps,
                                        max_frames=it.max_frames, nframes=it.nframes)

    async def close(self) -> None:
        if self._own[0]:
            self.images.close()
        if self._own[1]:
            self.videos.close()
