"""What a worker makes of a request's images, computed by the router from the same bytes,
so that a prompt with media is keyed in the namespace the worker's tree keys it in.

A worker keys a multimodal prompt's pages under `request_namespace(media_cache_key(item
keys), salt)`, each
item's key being `digest_key(sha256 of its bytes, processor settings, variant)`, and expands
each image's pad token to `tokens_per_item(grid)` copies, the grid following from the
decoded size through `smart_resize`. The router needs the bytes for the digest and the
image header for the size; it decodes no pixels. The worker turns an image by its EXIF
orientation, but a quarter turn swaps height and width, and `smart_resize` rounds each side
alike, so the token count is the same either way. The router has the bytes only for data:
URLs: an image at an http(s) or file URL, and any video (its token count depends on the
frames a decoder samples), leave the prompt unknown here and the request is routed by load
alone.
"""
from __future__ import annotations

import io
from collections.abc import Sequence

from ..multimodal.adapter import VisionAdapter
from ..multimodal.config import MediaConfig
from ..multimodal.embed_cache import content_digest, digest_key
from ..multimodal.errors import MediaError
from ..multimodal.fetch import decode_data_url
from ..multimodal.item import MediaItem
from ..multimodal.placeholders import expand_placeholders, media_cache_key, pad_kinds
from ..multimodal.preprocess import ProcessorSettings, smart_resize


def image_grid(data: bytes, s: ProcessorSettings, max_pixels: int) -> tuple[int, int, int] | None:
    """The patch grid a worker gives this image, up to a quarter turn (None: it is not an
    image the worker would take)."""
    import warnings

    from PIL import Image
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as im:
                w, h = im.size
                if w <= 0 or h <= 0 or w * h > max_pixels:
                    return None
        except Exception:  # noqa: BLE001 - the worker answers an image it cannot open
            return None
    try:
        rh, rw = smart_resize(h, w, s.factor, s.min_pixels, s.max_pixels)
    except MediaError:
        return None
    # A still image is one frame, padded to temporal_patch_size: one temporal patch.
    return (1, rh // s.patch_size, rw // s.patch_size)


class MediaKeys:
    """The expanded prompt ids and media cache key of a request with media, as its worker
    builds them, or None when the router cannot know them."""
    def __init__(self, adapter: VisionAdapter, media: MediaConfig = MediaConfig()):
        self.adapter, self.media = adapter, media
        self.settings = adapter.processor_settings(media)
        self.fingerprint = self.settings.fingerprint()
        self.pads = pad_kinds(adapter)

    def expand(self, ids: Sequence[int], items: Sequence[MediaItem]
               ) -> tuple[list[int], str] | None:
        keys, counts = [], []
        for it in items:
            if it.kind != "image" or not it.url.startswith("data:"):
                return None
            try:
                data = decode_data_url(it.url, self.media.max_bytes)
            except MediaError:
                return None
            grid = image_grid(data, self.settings, self.media.max_image_pixels)
            if grid is None:
                return None
            keys.append(digest_key(content_digest(data), self.fingerprint, it.variant()))
            counts.append(self.adapter.tokens_per_item(grid))
        try:
            full = expand_placeholders(ids, self.pads, [it.kind for it in items], counts)
        except ValueError:
            return None
        return full, media_cache_key(keys)
