"""MediaItem: one image or video of a request, as the API layer hands it to the stages."""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("image", "video")


@dataclass(frozen=True)
class MediaItem:
    kind: str                       # "image" | "video"
    url: str                        # http(s), data:, file:// or an absolute path
    # Video only; None means the configured default.
    fps: float | None = None
    max_frames: int | None = None
    nframes: int | None = None      # a fixed frame count instead of the fps rule
    stream: int | None = None       # container stream index; None: the largest picture

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"media kind must be one of {KINDS}, not {self.kind!r}")

    def variant(self) -> str:
        """What besides the bytes changes this item's pixels (part of its cache key)."""
        if self.kind == "image":
            return ""
        return f"fps={self.fps},max={self.max_frames},n={self.nframes},stream={self.stream}"
