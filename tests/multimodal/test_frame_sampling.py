"""Frame sampling and per-frame pixel budget: pinned to qwen-vl-utils' rules."""
from __future__ import annotations

import numpy as np
import pytest

from mimo.multimodal.errors import MediaDecodeError
from mimo.multimodal.sampling import frame_indices, frame_max_pixels, smart_nframes


@pytest.mark.parametrize("total, fps, kw, want", [
    (390, 30000 / 1001, {}, 26),       # nasa_13013.mp4 stream 3: 13.0 s at 2 fps
    (325, 25.0, {}, 26),               # its stream 0: 13.0 s
    (108_000, 30.0, {}, 768),          # one hour: capped at max_frames
    (108_000, 30.0, {"max_frames": 101}, 100),   # the cap itself floored to even
    (1800, 30.0, {"fps": 1.0}, 60),    # one minute at 1 fps
    (10, 30.0, {}, 4),                 # 0.33 s: raised to min_frames
    (3, 30.0, {}, 2),                  # shorter than min_frames: as many as exist, even
    (7, 30.0, {"min_frames": 5}, 6),   # min_frames rounded up to 6, fits in 7
    # A fixed count, rounded to a multiple of 2 with Python's round (half to even):
    (1000, 30.0, {"nframes": 7}, 8),   # 3.5 -> 4
    (1000, 30.0, {"nframes": 9}, 8),   # 4.5 -> 4
    (1000, 30.0, {"nframes": 11}, 12),
    (45, 29.97, {}, 4),                # 1.5 s x 2 = 3.003 -> min 4
    (95, 29.97, {}, 6),                # 3.17 s x 2 = 6.34 -> 6
])
def test_smart_nframes(total, fps, kw, want):
    n = smart_nframes(total, fps, **kw)
    assert n == want and n % 2 == 0


def test_too_short_videos_refused():
    for total in (0, 1):
        with pytest.raises(MediaDecodeError, match="at least 2"):
            smart_nframes(total, 30.0)
    with pytest.raises(MediaDecodeError):
        smart_nframes(10, 30.0, nframes=12)


def test_frame_indices():
    idx = frame_indices(390, 26)
    # linspace over [0, total-1], rounded half to even (numpy rounds the same way).
    assert idx == np.round(np.linspace(0, 389, 26)).astype(int).tolist()
    assert idx[0] == 0 and idx[-1] == 389 and len(idx) == 26
    assert all(b > a for a, b in zip(idx, idx[1:]))
    assert frame_indices(4, 4) == [0, 1, 2, 3]
    assert frame_indices(100, 2) == [0, 99]


def test_frame_max_pixels():
    assert frame_max_pixels(4) == 768 * 28 * 28               # few frames: per-frame cap
    assert frame_max_pixels(768) == int(128000 * 28 * 28 * 0.9 / 768 * 2)   # = 235200
    assert frame_max_pixels(768) == 300 * 28 * 28
    # Never below 1.05 x min_pixels, however many frames.
    assert frame_max_pixels(100_000) == int(128 * 28 * 28 * 1.05)
