"""DecodedMedia: one media item of a request after decoding, with the digest of the bytes it
came from (the embedding-cache key is made of it, so later steps need not hold the bytes)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .video import DecodedVideo


@dataclass(frozen=True)
class DecodedMedia:
    kind: str                           # "image" | "video"
    pixels: np.ndarray | DecodedVideo   # image: [H, W, 3] uint8; video: sampled frames
    digest: str                         # embed_cache.content_digest of the fetched bytes
