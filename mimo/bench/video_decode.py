"""video-decode: sampled-frame video decoding time per number of parallel chunk readers.

Decodes one H.264 video (default: 60 s of 1280x720 at 30 fps, generated once with PyAV
and cached) with mimo.multimodal.video's chunked readers, for each worker count in --workers,
rounds interleaved so a noisy machine disturbs all counts alike. Frames are sampled the
Qwen2.5-VL way (--sample-fps, --max-frames). Reports the median time per count and the
speedup over the first count, the cores the process kept busy, and, measured in the same
rounds, the speedup of a GIL-free control (threaded sha256): on a shared machine the
control shows how much parallelism was available at all. Progress goes to stderr; the
last stdout line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

NAME = "video-decode"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="parallel chunked video decoding: time per worker count",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2", help="comma-separated reader counts")
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--size", default="1280x720", help="WIDTHxHEIGHT")
    p.add_argument("--fps", type=int, default=30, help="frame rate of the generated video")
    p.add_argument("--gop", type=int, default=60, help="keyframe interval (frames)")
    p.add_argument("--sample-fps", type=float, default=2.0, help="frames sampled per second")
    p.add_argument("--max-frames", type=int, default=768)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--video", default=None, help="decode this file instead of generating one")
    p.add_argument("--cache-dir", default=None,
                   help="where the generated video is kept (default: a mimo-bench temp dir)")
    return p


def _log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def synthetic_video(path: Path, seconds: int, width: int, height: int, fps: int,
                    gop: int) -> Path:
    """Moving blocky noise over a sliding gradient: motion the encoder must track, detail
    it cannot drop, so decoding costs what a real video's does (not a flat test card)."""
    import av
    import numpy as np
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
    base = blocks.repeat(16, 0).repeat(16, 1)[:height + 16, :width + 16]
    ramp = (np.arange(width, dtype=np.uint16)[None, :, None] * 255 // width).astype(np.uint8)
    tmp = path.with_suffix(".part")
    n = seconds * fps
    with av.open(str(tmp), "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "veryfast", "crf": "23", "g": str(gop)}
        t0 = time.monotonic()
        for i in range(n):
            dy, dx = (i * 2) % 16, (i * 3) % 16
            img = base[dy:dy + height, dx:dx + width] // 2 + np.roll(ramp, i * 4, axis=1) // 2
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img),
                                                         format="rgb24")):
                c.mux(p)
            if (i + 1) % (fps * 10) == 0:
                _log(f"generating: {(i + 1) // fps}/{seconds} s "
                     f"({time.monotonic() - t0:.0f} s elapsed)")
        for p in s.encode():
            c.mux(p)
    os.replace(tmp, path)   # only a complete file ever has the final name
    return path


def _video_path(args) -> Path:
    if args.video:
        return Path(args.video)
    w, h = (int(x) for x in args.size.lower().split("x"))
    d = Path(args.cache_dir or Path(tempfile.gettempdir()) / "mimo-bench")
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"synthetic-{args.seconds}s-{w}x{h}-{args.fps}fps-g{args.gop}.mp4"
    if not path.exists():
        _log(f"generating {path} (once; cached)")
        synthetic_video(path, args.seconds, w, h, args.fps, args.gop)
    return path


def _cpu_s() -> float:
    import resource
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _control(workers: int, total_mib: int = 256) -> float:
    """Seconds for sha256 over `total_mib` MiB split across `workers` threads. hashlib
    releases the GIL, so this is what the machine allows in parallel right now: the
    ceiling the decode speedup is judged against."""
    import hashlib
    import threading
    part = b"\0" * (total_mib * 2**20 // workers)
    threads = [threading.Thread(target=lambda: hashlib.sha256(part).digest())
               for _ in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def run(args) -> int:
    from ..multimodal.video import VideoDecoder, probe
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("--workers needs positive integers, e.g. 1,2")
    path = _video_path(args)
    data = path.read_bytes()
    info = probe(data)
    decoders = {w: VideoDecoder(workers=w, threads_per_reader=1, fps=args.sample_fps,
                                max_frames=args.max_frames, max_decoded_bytes=2**40)
                for w in counts}
    times: dict[int, list[float]] = {w: [] for w in counts}
    cpu: dict[int, list[float]] = {w: [] for w in counts}
    control: dict[int, list[float]] = {w: [] for w in counts}
    frames = None
    try:
        for r in range(args.rounds):
            for w in counts:
                c0, t0 = _cpu_s(), time.perf_counter()
                v = decoders[w].decode_sync(data)
                times[w].append(time.perf_counter() - t0)
                cpu[w].append(_cpu_s() - c0)
                frames = v.frames.shape
                control[w].append(_control(w))
                _log(f"round {r + 1}/{args.rounds}: {w} worker(s) {times[w][-1]:.2f} s, "
                     f"{cpu[w][-1] / times[w][-1]:.2f} cores busy")
    finally:
        for d in decoders.values():
            d.close()
    med = {w: statistics.median(ts) for w, ts in times.items()}
    # CPU seconds per wall second: ~w when the readers really run in parallel. On a shared
    # machine the kernel splits CPU between sessions (autogroup), so when other sessions
    # are busy this stays near the same value for every w and the speedup collapses: the
    # number that tells a busy machine from code that does not scale.
    busy = {w: sum(cpu[w]) / sum(times[w]) for w in counts}
    ctl = {w: statistics.median(ts) for w, ts in control.items()}
    base = counts[0]
    for w in counts:
        print(f"{w} worker(s): {med[w]:.2f} s median  speedup {med[base] / med[w]:.2f}x  "
              f"{busy[w]:.2f} cores busy  (GIL-free control: {ctl[base] / ctl[w]:.2f}x)")
    print(json.dumps({
        "bench": NAME, "video": str(path), "bytes": len(data),
        "source": {"width": info.width, "height": info.height, "fps": round(info.fps, 3),
                   "frames": info.total_frames},
        "sampled_frames": frames[0] if frames else 0, "sample_fps": args.sample_fps,
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "rounds": args.rounds,
        "seconds": {str(w): [round(t, 3) for t in times[w]] for w in counts},
        "median_s": {str(w): round(med[w], 3) for w in counts},
        "speedup": {str(w): round(med[base] / med[w], 3) for w in counts},
        "cores_busy": {str(w): round(busy[w], 2) for w in counts},
        "control_speedup": {str(w): round(ctl[base] / ctl[w], 3) for w in counts},
    }))
    return 0
