"""Qwen2.5-VL preprocessing vs transformers' Qwen2VLImageProcessor (PIL backend, which
needs no torchvision), and the video grid and patch-order rules."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.media import media_path
from PIL import Image

from mimo.multimodal.image import decode_image
from mimo.multimodal.preprocess import (
    OPENAI_CLIP_STD,
    ProcessorSettings,
    patchify,
    preprocess_images,
    preprocess_video,
    smart_resize,
    video_size,
)

IMAGES = ["astronaut.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg"]
# One 8-bit level in normalized units, per column of pixel_values (C, T, p, p order).
LEVEL = np.repeat(np.array(OPENAI_CLIP_STD), 2 * 14 * 14)[None] * 255


def hf_processor(**kw):
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    return mod.Qwen2VLImageProcessorPil(**kw)


def load(name):
    return decode_image(media_path(name).read_bytes(), 1 << 30)


@pytest.mark.parametrize("kw", [{}, {"min_pixels": 600 * 28 * 28, "max_pixels": 2000 * 28 * 28},
                                {"max_pixels": 100 * 28 * 28}])
def test_images_match_transformers(kw):
    hf = hf_processor(**kw)
    imgs = [load(n) for n in IMAGES]
    ours = preprocess_images(imgs, ProcessorSettings(**kw))
    for name, img, got in zip(IMAGES, imgs, ours):
        ref = hf(images=[Image.fromarray(img)], return_tensors="np")
        assert got.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0]), name
        pv = ref["pixel_values"]
        assert got.pixel_values.shape == pv.shape and got.pixel_values.dtype == torch.float32
        levels = np.abs(got.pixel_values.numpy() - pv) / (1 / LEVEL)
        # PIL's fixed-point filter and ours round differently on a few pixels by a level
        # or two; a wrong filter, pass order or patch order shows up as tens of levels
        # on a large share of values.
        assert levels.max() <= 2.01, (name, levels.max())
        assert (levels > 0.5).mean() < 0.01, (name, (levels > 0.5).mean())


def test_no_resize_is_exact():
    """A size already on the 28-grid skips resizing: normalize and patch order must then
    match transformers to float precision."""
    img = np.ascontiguousarray(load("astronaut.png")[:280, :448])
    ref = hf_processor()(images=[Image.fromarray(img)], return_tensors="np")
    got = preprocess_images([img])[0]
    assert got.grid_thw == (1, 20, 32)
    np.testing.assert_allclose(got.pixel_values.numpy(), ref["pixel_values"], atol=2e-6)


def test_batched_equals_one_by_one():
    imgs = [load("rocket.jpg"), load("astronaut.png"), load("rocket.jpg")[::-1].copy()]
    together = preprocess_images(imgs)
    for img, t in zip(imgs, together):
        alone = preprocess_images([img])[0]
        assert alone.grid_thw == t.grid_thw
        assert torch.equal(alone.pixel_values, t.pixel_values)


@pytest.mark.parametrize("h, w, want", [
    (512, 512, (504, 504)), (400, 600, (392, 588)), (872, 1000, (868, 1008)),
    (10, 10, (56, 56)),                       # raised to min_pixels
    (4000, 3000, (1148, 840)),                # lowered to max_pixels, floored
    (28, 5000, (28, 5012)),                   # long and thin: rounded, within budget
    (20, 3000, (28, 2996)),
])
def test_smart_resize_values(h, w, want):
    got = smart_resize(h, w)
    assert got == want
    gh, gw = got
    assert gh % 28 == 0 and gw % 28 == 0
    assert 56 * 56 <= gh * gw <= 28 * 28 * 1280


def test_smart_resize_matches_transformers_on_a_sweep():
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 6000, size=(3000, 2))
    sizes = [(int(h), int(w)) for h, w in sizes if max(h, w) / min(h, w) <= 200]
    for lo, hi in [(56 * 56, 28 * 28 * 1280), (128 * 28 * 28, 768 * 28 * 28)]:
        for h, w in sizes:
            assert smart_resize(h, w, 28, lo, hi) == mod.smart_resize(h, w, 28, lo, hi)


def test_extreme_aspect_ratio_refused():
    from mimo.multimodal.errors import MediaError
    with pytest.raises(MediaError, match="aspect ratio"):
        smart_resize(10, 2500)


def test_video_grid_rules():
    s = ProcessorSettings()
    # nasa_13013.mp4's 480x270 stream at 26 sampled frames.
    assert video_size(26, 270, 480, s) == (280, 476)
    frames = np.zeros((26, 270, 480, 3), dtype=np.uint8)
    out = preprocess_video(frames, s)
    assert out.grid_thw == (13, 20, 34)
    assert out.pixel_values.shape == (13 * 20 * 34, 3 * 2 * 14 * 14)
    assert out.num_tokens == 13 * 20 * 34 // 4
    # An odd frame count is padded by repeating the last frame: ceil(T / 2).
    assert preprocess_video(frames[:5], s).grid_thw == (3, 20, 34)
    # Many frames shrink each frame: 768 frames of 1080p get at most 300 x 28 x 28 pixels.
    h, w = video_size(768, 1080, 1920, s)
    assert h * w <= 300 * 28 * 28 and h % 28 == 0 and w % 28 == 0


def test_video_patch_order_from_first_principles():
    """Row r of pixel_values is the patch at (t, block row, block col, row in block, col in
    block), blocks being 2x2 merge windows in raster order; a row's values are (C, T, 14,
    14) in C order. Check every row against the frames directly."""
    s = ProcessorSettings()
    rng = torch.Generator().manual_seed(0)
    t, h, w = 4, 56, 84
    frames = torch.rand(t, 3, h, w, generator=rng)
    rows, (gt, gh, gw) = patchify(frames, s)
    assert (gt, gh, gw) == (2, 4, 6)
    row = 0
    for ti in range(gt):
        for bh in range(gh // 2):
            for bw in range(gw // 2):
                for mh in range(2):
                    for mw in range(2):
                        y, x = (bh * 2 + mh) * 14, (bw * 2 + mw) * 14
                        block = frames[ti * 2:ti * 2 + 2, :, y:y + 14, x:x + 14]   # T C p p
                        want = block.permute(1, 0, 2, 3).reshape(-1)               # C T p p
                        assert torch.equal(rows[row], want)
                        row += 1
    assert row == rows.shape[0]


def test_still_video_equals_image():
    img = np.ascontiguousarray(load("coffee.png")[:392, :588])
    image = preprocess_images([img])[0]
    frames = np.stack([img, img])
    s = ProcessorSettings(video_min_pixels=56 * 56, video_max_pixels=28 * 28 * 1280)
    video = preprocess_video(frames, s)
    assert video.grid_thw == image.grid_thw
    assert torch.equal(video.pixel_values, image.pixel_values)


def test_fingerprint_tracks_settings():
    a, b = ProcessorSettings(), ProcessorSettings(max_pixels=1000 * 28 * 28)
    assert a.fingerprint() == ProcessorSettings().fingerprint() != b.fingerprint()
    assert math.isclose(len(a.fingerprint()), 16)
