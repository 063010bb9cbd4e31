"""Image decoding: bytes -> RGB uint8 array [H, W, 3], in a process pool.

PIL decoding holds the GIL for much of its work, so decoding on the event loop (or its
threads) would stall every other request; worker processes decode in parallel instead.
The pixel count is checked from the header, before any pixel is decoded: a 100k x 100k
PNG is a few hundred bytes on the wire and 30 GB in memory.
"""
from __future__ import annotations

import asyncio
import io
import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import MediaDecodeError, MediaTooLarge


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    """Decode one image (blocking; the worker-process entry point). EXIF orientation is
    applied and the result is RGB, transparent areas over white (as transformers'
    convert_rgb does, so embeddings match the reference processor)."""
    with warnings.catch_warnings():
        # Our own bound replaces PIL's global one (a process-wide setting we leave alone).
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:
            raise MediaTooLarge(f"image too large: {e}") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise MediaDecodeError(f"not a decodable image ({type(e).__name__}: {e})") from None
        with im:
            w, h = im.size
            if w <= 0 or h <= 0:
                raise MediaDecodeError(f"image has an empty size {w}x{h}")
            if w * h > max_pixels:
                raise MediaTooLarge(f"image is {w}x{h} = {w * h} pixels, over the limit of "
                                    f"{max_pixels}")
            try:
                im.load()
                upright = ImageOps.exif_transpose(im)
                return np.asarray(_to_rgb(upright))
            except Image.DecompressionBombError as e:
                raise MediaTooLarge(f"image too large: {e}") from None
            except (OSError, SyntaxError, ValueError, EOFError) as e:
                # Truncated or corrupt pixel data surfaces only now, at load().
                raise MediaDecodeError(f"corrupt image data ({type(e).__name__}: {e})") from None


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode == "RGB":
        return im
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return im.convert("RGB")


def _worker_init() -> None:
    # Inside our own worker processes the configured bound is the only one: PIL's global
    # default (about 179M pixels) would otherwise refuse images the config allows.
    Image.MAX_IMAGE_PIXELS = None


def _pool_context():
    # fork would copy a process that may run torch's thread pools (unsafe); forkserver
    # starts workers from a clean, small process.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class ImageDecoder:
    """Decodes images in `workers` processes. One per server; `close()` on shutdown.
    A crashed worker (e.g. killed for memory) fails only the image it was decoding; the
    pool is rebuilt for the next one."""

    def __init__(self, workers: int = 2, max_pixels: int = 64 * 2**20):
        self.workers = workers
        self.max_pixels = max_pixels
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=_pool_context(),
                                             initializer=_worker_init)
        return self._pool

    async def decode(self, data: bytes) -> np.ndarray:
        loop = asyncio.get_running_loop()
        pool = self._executor()
        try:
            return await loop.run_in_executor(pool, decode_image, data, self.max_pixels)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise MediaDecodeError("the image decoder crashed on this image") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
