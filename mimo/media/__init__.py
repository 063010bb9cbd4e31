"""mimo.media: getting images and videos from a request into model-ready tensors.

fetch (http(s), data:, allowed local files; SSRF-safe) -> decode (images in a process
pool, videos as parallel chunk readers) -> preprocess (Qwen2.5-VL resize, normalize,
patchify as torch ops). Plus an embedding cache and a consistent-hash ring for routing
media to encoder workers. Every client fault is a `MediaError` (errors.py).
"""
from .config import MediaConfig
from .errors import MediaDecodeError, MediaError, MediaFetchError, MediaForbidden, MediaTooLarge

__all__ = ["MediaConfig", "MediaDecodeError", "MediaError", "MediaFetchError",
           "MediaForbidden", "MediaTooLarge"]
