"""Qwen2-VL / Qwen2.5-VL preprocessing as torch ops: resize, rescale, normalize, patchify.

Runs on whatever device the tensors are on (the serving GPU in production), batched over
images of the same shape. It reproduces transformers' Qwen2VLImageProcessor:

* `smart_resize` picks a size divisible by patch x merge (28) within [min, max] pixels;
* bicubic resize: torch's antialiased bicubic is PIL's filter (a = -0.5, support widened
  when shrinking), in two uint8 passes in PIL's order (see `resize`); the result differs
  from PIL's by at most a level or two of 255 on well under 1% of values (bounded in the
  tests, for both resampling kernels below);
* patchify (on uint8, a quarter of the bytes to move) into
  [grid_t * grid_h * grid_w, C * temporal_patch * patch * patch], rows in 2x2 merge-window
  order (the merger concatenates 4 consecutive rows), as transformers does;
* rescale by 1/255 and normalize with the CLIP mean and std.

One code path for every device: the same functions run where the tensors are, and only the
resampling kernel inside a pass is torch's choice of device. `kernel="auto"` takes torch's
uint8 kernel for uint8 on CPU (a port of Pillow-SIMD's fixed-point filter, 10x faster there)
and the float kernel elsewhere (CUDA has no uint8 one); `kernel="float"` runs the device's
arithmetic on CPU too, which is how the tests check the GPU path against PIL without a GPU.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .errors import MediaError
from .sampling import VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, VIDEO_TOTAL_PIXELS, frame_max_pixels

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_RATIO = 200
_FRAME_BATCH = 32   # video frames resized at once: bounds the working memory


@dataclass(frozen=True)
class ProcessorSettings:
    """Everything that decides the pixel values; part of the embedding-cache key."""
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = VIDEO_MIN_PIXELS
    video_max_pixels: int = VIDEO_MAX_PIXELS
    video_total_pixels: int = VIDEO_TOTAL_PIXELS
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def fingerprint(self) -> str:
        return hashlib.sha256(repr(sorted(asdict(self).items())).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Patches:
    pixel_values: torch.Tensor          # [grid_t * grid_h * grid_w, C * tps * p * p] float32
    grid_thw: tuple[int, int, int]

    @property
    def num_tokens(self) -> int:
        """Tokens the LLM sees after the 2x2 merge."""
        t, h, w = self.grid_thw
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """The resized (height, width): both divisible by `factor`, pixels within
    [min_pixels, max_pixels], aspect ratio kept as closely as the grid allows."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise MediaError(f"image aspect ratio {max(height, width) / min(height, width):.0f}"
                         f":1 is over the limit of {MAX_RATIO}:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


KERNELS = ("auto", "uint8", "float")


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"resampling kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")


def _pass(x: torch.Tensor, size: tuple[int, int], kernel: str = "auto") -> torch.Tensor:
    if kernel == "uint8" and x.device.type != "cpu":
        raise ValueError(f"the uint8 resampling kernel runs on CPU only, not {x.device}")
    if kernel != "float" and x.dtype == torch.uint8 and x.device.type == "cpu":
        # torch's CPU uint8 antialiased path is a port of Pillow-SIMD's: same fixed-point
        # arithmetic and rounding, and 10x faster than the float path.
        return F.interpolate(x, size=size, mode="bicubic", antialias=True)
    y = F.interpolate(x.float(), size=size, mode="bicubic", antialias=True,
                      align_corners=False)
    return y.round_().clamp_(0, 255).to(torch.uint8)


def resize(x: torch.Tensor, size: tuple[int, int], kernel: str = "auto") -> torch.Tensor:
    """uint8 [N, C, H, W] -> uint8 [N, C, h, w], PIL-style bicubic (`kernel`: see the
    module docstring).

    Two separable passes, each rounded and clipped to uint8 as PIL keeps its intermediate
    image in uint8: at sharp edges the bicubic overshoot of the first pass is clipped
    before the second (one float pass with a final clip differs from PIL by up to ~15
    levels there). The pass order matters for the same reason; Pillow (13, measured on the
    test images) runs the vertical pass first exactly when it shrinks the height while the
    width grows, else the horizontal one first. A pass at unchanged size is skipped: the
    kernel is 1 at 0 and 0 at +-1, +-2, so it would be the identity."""
    _check_kernel(kernel)
    h, w = x.shape[-2:]
    nh, nw = size
    for axis in ("v", "h") if (nh < h and nw > w) else ("h", "v"):
        cur_h, cur_w = x.shape[-2:]
        target = (cur_h, nw) if axis == "h" else (nh, cur_w)
        if target != (cur_h, cur_w):
            x = _pass(x, target, kernel)
    return x


def normalize(pixel_values: torch.Tensor, s: ProcessorSettings) -> torch.Tensor:
    """Patch rows of uint8 [0, 255] -> float32 (x / 255 - mean) / std. Columns are laid
    out (C, T, p, p), so each channel's mean and std cover a contiguous run of columns.
    Normalizing after patchify moves a quarter of the bytes through the permute."""
    run = s.temporal_patch_size * s.patch_size ** 2
    mean = torch.tensor(s.image_mean, dtype=torch.float64).repeat_interleave(run)
    std = torch.tensor(s.image_std, dtype=torch.float64).repeat_interleave(run)
    # One fused multiply-add, x * (1 / (255 std)) - mean / std, instead of four passes
    # over the tensor; it differs from the unfused form by an ulp or so.
    dev = pixel_values.device
    scale = (1.0 / (255.0 * std)).to(torch.float32).to(dev)
    bias = (-mean / std).to(torch.float32).to(dev)
    return torch.addcmul(bias, pixel_values.float(), scale)


def patchify(frames: torch.Tensor, s: ProcessorSettings) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[T, C, H, W] (any dtype) -> (rows [grid_t * grid_h * grid_w, C * tps * p * p],
    grid_thw). T is padded to a multiple of temporal_patch_size by repeating the last
    frame (a still image becomes tps identical frames)."""
    t, c, h, w = frames.shape
    tps, p, m = s.temporal_patch_size, s.patch_size, s.merge_size
    if pad := -t % tps:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
        t += pad
    gt, gh, gw = t // tps, h // p, w // p
    if h % (p * m) or w % (p * m):
        raise ValueError(f"frame size {h}x{w} is not a multiple of {p * m}")
    x = frames.reshape(gt, tps, c, gh // m, m, p, gw // m, m, p)
    # (gt, gh/m, gw/m, m, m, C, tps, p, p): rows walk merge windows, then the 2x2 inside.
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tps * p * p), (gt, gh, gw)


def to_patches(frames: torch.Tensor, s: ProcessorSettings) -> Patches:
    """Resized uint8 frames [T, C, H, W] -> normalized Patches."""
    rows, grid = patchify(frames, s)
    return Patches(normalize(rows, s), grid)


def _as_tensor(img, device) -> torch.Tensor:
    """HWC uint8 (numpy or torch) -> CHW uint8 tensor on device."""
    if isinstance(img, np.ndarray):
        # Decoded arrays may be read-only views (PIL buffers); torch wants writable memory.
        img = torch.from_numpy(img if img.flags.writeable else img.copy())
    t = img
    return t.to(device).permute(2, 0, 1)


def preprocess_images(images: Sequence, s: ProcessorSettings = ProcessorSettings(),
                      device: str | torch.device = "cpu", kernel: str = "auto"
                      ) -> list[Patches]:
    """RGB uint8 images [H, W, 3] -> one Patches each, in order, on `device`. Images of
    equal size are resized in one batched call."""
    _check_kernel(kernel)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(tuple(img.shape[:2]), []).append(i)
    out: list[Patches | None] = [None] * len(images)
    for (h, w), idx in groups.items():
        size = smart_resize(h, w, s.factor, s.min_pixels, s.max_pixels)
        batch = resize(torch.stack([_as_tensor(images[i], device) for i in idx]), size,
                       kernel)
        for j, i in enumerate(idx):
            out[i] = to_patches(batch[j:j + 1], s)
    return out  # type: ignore[return-value]


def video_size(n: int, height: int, width: int, s: ProcessorSettings) -> tuple[int, int]:
    """The resized frame size for a video of `n` sampled frames (qwen-vl-utils rule)."""
    cap = frame_max_pixels(n, min_pixels=s.video_min_pixels, max_pixels=s.video_max_pixels,
                           total_pixels=s.video_total_pixels, frame_factor=s.temporal_patch_size)
    return smart_resize(height, width, s.factor, s.video_min_pixels, cap)


def preprocess_video(frames, s: ProcessorSettings = ProcessorSettings(),
                     device: str | torch.device = "cpu", kernel: str = "auto") -> Patches:
    """RGB uint8 frames [T, H, W, 3] -> Patches with grid_t = ceil(T / tps), on `device`."""
    _check_kernel(kernel)
    t, h, w = frames.shape[:3]
    size = video_size(t, h, w, s)
    parts = []
    for a in range(0, t, _FRAME_BATCH):
        chunk = torch.stack([_as_tensor(f, device) for f in frames[a:a + _FRAME_BATCH]])
        parts.append(resize(chunk, size, kernel))
    return to_patches(torch.cat(parts), s)
