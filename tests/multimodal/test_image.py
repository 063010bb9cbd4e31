"""Image decoding: real files, EXIF orientation, alpha, corrupt/truncated data, bombs."""
from __future__ import annotations

import asyncio
import io
import struct
import time
import zlib

import numpy as np
import pytest
from helpers.media import media_path
from PIL import Image

from mimo.multimodal.errors import MediaDecodeError, MediaTooLarge
from mimo.multimodal.image import ImageDecoder, decode_image

LIMIT = 64 * 2**20


def png_header_only(width: int, height: int) -> bytes:
    """A syntactically valid PNG that claims width x height RGB pixels: signature, IHDR
    (with its CRC), one tiny IDAT, IEND. A few dozen bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))


def test_real_images_match_pil():
    for name, shape in [("astronaut.png", (512, 512, 3)), ("hubble_deep_field.jpg", (872, 1000, 3)),
                        ("rocket.jpg", None), ("coffee.png", None)]:
        data = media_path(name).read_bytes()
        got = decode_image(data, LIMIT)
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert got.dtype == np.uint8 and got.ndim == 3 and got.shape[2] == 3
        assert shape is None or got.shape == shape
        np.testing.assert_array_equal(got, ref)


def test_exif_orientation_applied():
    rng = np.random.default_rng(0)
    px = rng.integers(0, 255, (20, 40, 3), dtype=np.uint8)
    px[:, :20] = 0          # distinguish left from right so a wrong rotation shows
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6        # "rotate 90 CW to display"
    Image.fromarray(px).save(buf, format="PNG", exif=exif)
    got = decode_image(buf.getvalue(), LIMIT)
    assert got.shape == (40, 20, 3)
    np.testing.assert_array_equal(got, np.rot90(px, k=-1))


def test_alpha_over_white():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[:2, :, :] = (255, 0, 0, 255)    # top half opaque red, bottom fully transparent
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    got = decode_image(buf.getvalue(), LIMIT)
    assert (got[:2] == (255, 0, 0)).all() and (got[2:] == 255).all()


def test_corrupt_and_truncated(monkeypatch):
    with pytest.raises(MediaDecodeError, match="not a decodable image"):
        decode_image(b"\x00garbage" * 100, LIMIT)
    with pytest.raises(MediaDecodeError):
        decode_image(b"", LIMIT)
    for name in ("astronaut.png", "rocket.jpg"):
        data = media_path(name).read_bytes()
        with pytest.raises(MediaDecodeError):
            decode_image(data[: len(data) // 2], LIMIT)


def test_bomb_refused_from_header_without_decoding(monkeypatch):
    bomb = png_header_only(100_000, 100_000)
    assert len(bomb) < 100
    loads = []
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(1))
    t0 = time.perf_counter()
    # (In-process PIL's own global bound may speak first; in the pool, ours does.)
    with pytest.raises(MediaTooLarge, match="100000x100000|10000000000 pixels"):
        decode_image(bomb, LIMIT)
    assert time.perf_counter() - t0 < 0.5 and loads == []
    # Our limit, not PIL's global one, decides: a modest limit refuses a 3000x3000 header.
    with pytest.raises(MediaTooLarge, match="3000x3000"):
        decode_image(png_header_only(3000, 3000), 1_000_000)


def test_process_pool_decoder():
    async def main():
        dec = ImageDecoder(workers=2, max_pixels=LIMIT)
        try:
            datas = [media_path(n).read_bytes() for n in ("astronaut.png", "rocket.jpg")]
            outs = await asyncio.gather(*(dec.decode(d) for d in datas),
                                        dec.decode(png_header_only(100_000, 100_000)),
                                        dec.decode(b"junk"), return_exceptions=True)
        finally:
            dec.close()
        return datas, outs
    datas, outs = asyncio.run(main())
    np.testing.assert_array_equal(outs[0], decode_image(datas[0], LIMIT))
    np.testing.assert_array_equal(outs[1], decode_image(datas[1], LIMIT))
    assert isinstance(outs[2], MediaTooLarge) and "100000x100000" in str(outs[2])
    assert isinstance(outs[3], MediaDecodeError)
