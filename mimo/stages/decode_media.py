"""decode_media: fetched bytes -> RGB frames, images in a process pool, videos by
parallel chunk readers. Returns, in item order, an ndarray [H, W, 3] per image and a
DecodedVideo per video."""
from __future__ import annotations

from ..multimodal.config import MediaConfig
from ..multimodal.image import ImageDecoder
from ..multimodal.video import VideoDecoder
from ..pipeline import Stage
from .media_items import gather_items, request_items


class DecodeMedia(Stage):
    name = "decode_media"

    def __init__(self, cfg: MediaConfig = MediaConfig(), *,
                 images: ImageDecoder | None = None, videos: VideoDecoder | None = None):
        super().__init__()
        # Decoders passed in are shared with others and stay open; our own close with us.
        self._own = (images is None, videos is None)
        self.images = images or ImageDecoder(cfg.decode_workers, cfg.max_image_pixels)
        self.videos = videos or VideoDecoder.from_config(cfg)

    async def process(self, req):
        items = request_items(req.data)
        blobs = req.data["fetch"]

        async def one(i, it):
            if it.kind == "image":
                return await self.images.decode(blobs[i])
            return await self.videos.decode(blobs[i], stream=it.stream, fps=it.fps,
                                            max_frames=it.max_frames, nframes=it.nframes)
        return await gather_items(items, one)

    async def close(self) -> None:
        if self._own[0]:
            self.images.close()
        if self._own[1]:
            self.videos.close()
