"""Device preprocessing (the float resampling kernel every non-CPU device runs) against PIL, on
the repository's real images and on real frames of its video.

`kernel="float"` runs on CPU the arithmetic a GPU runs: torch's antialiased bicubic in
float32, each pass rounded to uint8 as PIL keeps its intermediate image. Tolerance: at most
2 levels of 255 on any value, and fewer than 1% of values off by more than half a level.
Why not exact: PIL computes the filter in fixed point (coefficients scaled to integers,
22-bit precision) and rounds once per pass; torch's float kernel computes the same weights
in float32, so values that land near .5 before rounding can go either way, and the second
pass can carry a flipped level by one more. A wrong filter (bilinear, no antialias), a
wrong pass order or a wrong patch order shows up as tens of levels on a large share of
values, far outside this. On a CUDA machine the last test compares the device with the
CPU's float kernel (the same formula, a different summation order: 1 level).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.media import media_path
from PIL import Image

from mimo.multimodal.image import decode_image
from mimo.multimodal.preprocess import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ProcessorSettings,
    preprocess_images,
    preprocess_video,
    resize,
    video_size,
)

IMAGES = ["astronaut.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg"]
SETTINGS = [{}, {"min_pixels": 600 * 28 * 28, "max_pixels": 2000 * 28 * 28},
            {"max_pixels": 100 * 28 * 28}]
MAX_LEVELS, SHARE = 2.01, 0.01
# One 8-bit level in normalized units, per column of pixel_values (C, T, p, p order).
LEVEL = np.repeat(np.array(OPENAI_CLIP_STD), 2 * 14 * 14)[None] * 255


def _image(name):
    return decode_image(media_path(name).read_bytes(), 1 << 30)


@pytest.fixture(scope="module")
def video_frames():
    pytest.importorskip("av")       # (a GPU machine may run these without PyAV)
    from mimo.multimodal.video import VideoDecoder
    dec = VideoDecoder(workers=2)
    try:
        return dec.decode_sync(media_path("nasa_13013.mp4").read_bytes()).frames
    finally:
        dec.close()


def _within(levels: np.ndarray, what) -> None:
    assert levels.max() <= MAX_LEVELS, (what, float(levels.max()))
    assert (levels > 0.5).mean() < SHARE, (what, float((levels > 0.5).mean()))


@pytest.mark.parametrize("kw", SETTINGS)
def test_float_kernel_images_match_transformers_pil(kw):
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    hf = mod.Qwen2VLImageProcessorPil(**kw)
    imgs = [_image(n) for n in IMAGES]
    ours = preprocess_images(imgs, ProcessorSettings(**kw), kernel="float")
    for name, img, got in zip(IMAGES, imgs, ours):
        ref = hf(images=[Image.fromarray(img)], return_tensors="np")
        assert got.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0]), name
        pv = ref["pixel_values"]
        assert got.pixel_values.shape == pv.shape and got.pixel_values.dtype == torch.float32
        _within(np.abs(got.pixel_values.numpy() - pv) * LEVEL, name)


def _pil_resize(frames: np.ndarray, size) -> np.ndarray:
    h, w = size
    return np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])


def _reference_patches(frames: np.ndarray, s: ProcessorSettings) -> np.ndarray:
    """float64 normalize then patchify in transformers' layout, from resized frames."""
    x = (frames.astype(np.float64) / 255 - np.array(OPENAI_CLIP_MEAN)) / np.array(OPENAI_CLIP_STD)
    x = x.transpose(0, 3, 1, 2)                                    # T C H W
    if len(x) % s.temporal_patch_size:
        x = np.concatenate([x, np.repeat(x[-1:], -len(x) % s.temporal_patch_size, 0)])
    t, c, h, w = x.shape
    p, m, tps = s.patch_size, s.merge_size, s.temporal_patch_size
    x = x.reshape(t // tps, tps, c, h // p // m, m, p, w // p // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(-1, c * tps * p * p)


@pytest.mark.parametrize("kernel", ["float", "auto"])
def test_video_frames_match_pil(video_frames, kernel):
    """The sampled frames of the real video, resized as the video rule says, against PIL's
    bicubic frame by frame: the resized pixels, then the whole pixel_values."""
    s = ProcessorSettings()
    t, h, w = video_frames.shape[:3]
    size = video_size(t, h, w, s)
    assert size != (h, w), "the frames must actually be resized"
    want = _pil_resize(video_frames, size)
    got = resize(torch.from_numpy(video_frames).permute(0, 3, 1, 2), size, kernel)
    diff = np.abs(got.permute(0, 2, 3, 1).numpy().astype(int) - want.astype(int))
    _within(diff.astype(float), "resized frames")
    patches = preprocess_video(video_frames, s, kernel=kernel)
    ref = _reference_patches(want, s)
    assert patches.pixel_values.shape == ref.shape
    _within(np.abs(patches.pixel_values.numpy() - ref) * LEVEL, "pixel_values")


def test_kernels_agree_with_each_other():
    """The CPU's uint8 kernel and the device's float kernel: each is within tolerance of PIL,
    so of each other within twice that; in practice they differ on few values."""
    img = _image("coffee.png")
    a = preprocess_images([img], kernel="uint8")[0].pixel_values.numpy()
    b = preprocess_images([img], kernel="float")[0].pixel_values.numpy()
    levels = np.abs(a - b) * LEVEL
    assert levels.max() <= 2 * MAX_LEVELS and (levels > 0.5).mean() < 2 * SHARE


def test_unknown_kernel_refused():
    with pytest.raises(ValueError, match="resampling kernel"):
        preprocess_images([_image("rocket.jpg")], kernel="lanczos")
    with pytest.raises(ValueError, match="resampling kernel"):
        preprocess_video(np.zeros((2, 56, 56, 3), np.uint8), kernel="nearest")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_images_match_cpu_float_kernel():
    """On a GPU machine: the same call with device='cuda' gives the CPU float kernel's
    values within one level (the same formula, another summation order)."""
    imgs = [_image(n) for n in IMAGES]
    for cpu, dev in zip(preprocess_images(imgs, kernel="float"),
                        preprocess_images(imgs, device="cuda")):
        assert dev.pixel_values.device.type == "cuda" and dev.grid_thw == cpu.grid_thw
        levels = np.abs(dev.pixel_values.cpu().numpy() - cpu.pixel_values.numpy()) * LEVEL
        assert levels.max() <= 1.01


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_video_matches_cpu_float_kernel(video_frames):
    v_cpu = preprocess_video(video_frames, kernel="float")
    v_dev = preprocess_video(video_frames, device="cuda")
    assert v_dev.grid_thw == v_cpu.grid_thw
    levels = np.abs(v_dev.pixel_values.cpu().numpy() - v_cpu.pixel_values.numpy()) * LEVEL
    assert levels.max() <= 1.01
