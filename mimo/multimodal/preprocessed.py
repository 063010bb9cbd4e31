"""PreprocessedMedia: one media item of a request after preprocessing, as the encoder, the
vision adapter (rope positions) and the prompt builder read it."""
from __future__ import annotations

from dataclasses import dataclass

from .preprocess import Patches


@dataclass(frozen=True)
class PreprocessedMedia:
    kind: str                         # "image" | "video"
    key: str                          # EmbedCache key: content hash + settings + variant
    patches: Patches
    second_per_grid: float | None     # videos: seconds per temporal patch (rope input)
