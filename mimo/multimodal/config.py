"""MediaConfig: every bound and default of the media path, in one frozen dataclass."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, _from_dict


@dataclass(frozen=True)
class MediaConfig:
    """Limits for fetching and decoding media. The defaults are safe for a public server:
    no local files, no private addresses."""
    max_bytes: int = 64 * 2**20              # per fetched item (download, data: URL, file)
    timeout_s: float = 30.0                  # whole fetch, all redirects included
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0             # longest silence between two reads
    max_redirects: int = 5
    allowed_media_dirs: tuple[str, ...] = ()  # file:// and plain paths only under these
    allow_private: bool = False              # allow loopback/private/link-local hosts
    max_image_pixels: int = 64 * 2**20       # checked from the header, before decoding
    # Images are resized to at most this many pixels before encoding (each 28 x 28 = one
    # visual token); None: the checkpoint's own bound (its preprocessor_config.json).
    resize_max_pixels: int | None = None
    video_fps: float = 2.0                   # sampling rate (qwen-vl-utils FPS)
    video_min_frames: int = 4
    video_max_frames: int = 768
    video_max_decoded_bytes: int = 2 * 2**30  # sampled frames x H x W x 3, refused above
    video_decode_workers: int = 2            # chunk readers per video, in parallel
    video_threads_per_reader: int = 1        # codec threads inside each reader
    decode_workers: int = 2                  # image decode processes

    def __post_init__(self):
        if isinstance(self.allowed_media_dirs, (str, Path)):
            # A single string would otherwise be iterated character by character.
            object.__setattr__(self, "allowed_media_dirs", (str(self.allowed_media_dirs),))
        else:
            object.__setattr__(self, "allowed_media_dirs",
                               tuple(str(d) for d in self.allowed_media_dirs))
        positive = ("max_bytes", "timeout_s", "connect_timeout_s", "read_timeout_s",
                    "max_image_pixels", "video_fps", "video_max_frames",
                    "video_max_decoded_bytes", "video_decode_workers",
                    "video_threads_per_reader", "decode_workers")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"media option {name} must be > 0, not {getattr(self, name)!r}")
        if self.resize_max_pixels is not None and not self.resize_max_pixels > 0:
            raise ConfigError(f"media option resize_max_pixels must be > 0, not "
                              f"{self.resize_max_pixels!r}")
        if self.max_redirects < 0:
            raise ConfigError("media option max_redirects must be >= 0")
        if not 1 <= self.video_min_frames <= self.video_max_frames:
            raise ConfigError("media options need 1 <= video_min_frames <= video_max_frames")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MediaConfig:
        return _from_dict(cls, data)
