"""mimo.multimodal: everything between a request's image and video URLs and the embeddings
the language model reads in place of their placeholder tokens.

fetch (http(s), data:, allowed local files; SSRF-safe address vetting) -> decode (images in
a process pool, videos as parallel chunk readers) -> preprocess (resize, normalize,
patchify as torch ops on the serving device) -> encode (the vision tower, in process or in
encoder worker processes routed by a consistent-hash ring, behind an embedding cache) ->
placeholders expanded and an `MMPrompt` built for the engine.

What differs between vision-language families (placeholder tokens, processor settings,
multimodal rope positions, the tower) lives in one `VisionAdapter` per family
(adapters/, registered by model architecture); the rest of the server asks the adapter and
knows no family (`adapter.adapter_for`). Every client fault is a `MediaError` (errors.py).

This package's import stays light (no torch): image-decode worker processes import it.
"""
from .config import MediaConfig
from .errors import MediaDecodeError, MediaError, MediaFetchError, MediaForbidden, MediaTooLarge

__all__ = ["MediaConfig", "MediaDecodeError", "MediaError", "MediaFetchError",
           "MediaForbidden", "MediaTooLarge"]
