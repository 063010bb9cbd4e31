"""Synthetic test videos, written with PyAV."""
from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def write_video(path: Path, *, width: int = 64, height: int = 48, frames: int = 30,
                fps: int = 30, gop: int = 10, faststart: bool = False,
                preset: str = "ultrafast", seed: int = 0, progress=None) -> Path:
    """An H.264 mp4 whose frame i is distinguishable from its neighbours: blocky noise
    scrolled by i, so it does not compress to nothing, plus frame i's number in the
    top-left 8x8 block (brightness i % 256) so tests can tell which frame they got."""
    opts = {"movflags": "faststart"} if faststart else {}
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    base = base.repeat(8, 0).repeat(8, 1)[:height, :width]
    with av.open(str(path), "w", format="mp4", options=opts) as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": preset, "g": str(gop), "bf": "0"}
        for i in range(frames):
            img = np.roll(base, (i * 3, i * 5), (0, 1)).copy()
            img[:8, :8] = i % 256
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
            if progress is not None:
                progress(i + 1, frames)
        for p in s.encode():
            c.mux(p)
    return path
