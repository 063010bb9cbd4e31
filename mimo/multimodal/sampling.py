"""Video frame sampling and per-frame pixel budget, following qwen-vl-utils (the reference
preprocessing for Qwen2-VL / Qwen2.5-VL videos):

* `smart_nframes`: frames = duration x fps, clamped to [min_frames, max_frames] and to the
  video's length, then floored to a multiple of the temporal patch size (2), because the
  vision encoder folds every 2 consecutive frames into one temporal patch;
* `frame_indices`: that many indices spread evenly over [0, total - 1], rounded;
* `frame_max_pixels`: each frame's pixel cap shrinks as frames grow, so a long video's
  total pixel count (hence its token count) stays bounded.
"""
from __future__ import annotations

import math

import torch

from .errors import MediaDecodeError

FRAME_FACTOR = 2                      # temporal_patch_size of Qwen2(.5)-VL
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28
VIDEO_TOTAL_PIXELS = int(128000 * 28 * 28 * 0.9)   # 90% of a 128K-token context


def round_by_factor(x: float, factor: int) -> int:
    return round(x / factor) * factor


def ceil_by_factor(x: float, factor: int) -> int:
    return math.ceil(x / factor) * factor


def floor_by_factor(x: float, factor: int) -> int:
    return math.floor(x / factor) * factor


def smart_nframes(total_frames: int, video_fps: float, *, fps: float = FPS,
                  min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES,
                  nframes: int | None = None, frame_factor: int = FRAME_FACTOR) -> int:
    """How many frames to sample. `nframes` (a fixed count) overrides the fps rule."""
    if nframes is not None:
        n = round_by_factor(nframes, frame_factor)
    else:
        if video_fps <= 0:
            raise MediaDecodeError(f"video reports a frame rate of {video_fps}")
        lo = ceil_by_factor(min_frames, frame_factor)
        hi = floor_by_factor(min(max_frames, total_frames), frame_factor)
        wanted = total_frames / video_fps * fps
        n = floor_by_factor(min(max(wanted, lo), hi, total_frames), frame_factor)
    if not frame_factor <= n <= total_frames:
        raise MediaDecodeError(f"cannot sample {n} frames from a video of {total_frames} "
                               f"frames (at least {frame_factor} are needed)")
    return n


def frame_indices(total_frames: int, n: int) -> list[int]:
    """`n` frame indices evenly over the video, first and last frame included. torch's
    linspace and round-half-to-even, as qwen-vl-utils computes them, so indices match."""
    return torch.linspace(0, total_frames - 1, n).round().long().tolist()


def frame_max_pixels(n: int, *, min_pixels: int = VIDEO_MIN_PIXELS,
                     max_pixels: int = VIDEO_MAX_PIXELS, total_pixels: int = VIDEO_TOTAL_PIXELS,
                     frame_factor: int = FRAME_FACTOR) -> int:
    """The per-frame pixel cap for a video of `n` sampled frames: an even share of
    `total_pixels` per temporal patch, never above `max_pixels`, never below 1.05 x
    `min_pixels` (so the clamp in smart_resize stays consistent)."""
    return int(max(min(max_pixels, total_pixels / n * frame_factor), int(min_pixels * 1.05)))
