"""media_prompt: token ids with one pad token per media item + the encoder's embeddings ->
the expanded prompt ids and the engine's `MMPrompt` (multimodal.placeholders; the model's
vision adapter says which tokens are pads, how many rows an item yields and where each
token sits)."""
from __future__ import annotations

import asyncio

from ..multimodal.adapter import VisionAdapter
from ..multimodal.placeholders import place_media
from ..pipeline import InvalidRequest, Stage


class MediaPrompt(Stage):
    """Returns (prompt ids, MMPrompt | None); None for a request without media."""
    name = "mm_prompt"

    def __init__(self, adapter: VisionAdapter):
        super().__init__()
        self.adapter = adapter

    async def process(self, req):
        ids = req.data["tokenize"]
        media = req.data.get("preprocess") or []
        try:
            if not media:
                return place_media(ids, self.adapter, [], [])
            return await asyncio.to_thread(place_media, ids, self.adapter, media,
                                           req.data["encode"])
        except ValueError as e:      # placeholders and items do not pair up
            raise InvalidRequest(str(e)) from e
