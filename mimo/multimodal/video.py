"""Video decoding: sampled frames as RGB uint8 [T, H, W, 3], decoded by parallel readers.

Why PyAV and not decord: decord (0.6) has no way to choose a stream; it takes whatever
FFmpeg's av_find_best_stream picks. A file with several video streams (nasa_13013.mp4 has
a 320x180 and a 480x270 one) must be decoded from the stream we mean, so streams are
chosen here explicitly: the one asked for by index, else the largest (width x height),
never an attached picture (cover art).

Parallelism (MiMo-V2.5 report, section 6.2): the sampled indices are split into N
contiguous chunks; each chunk gets its own reader (container + codec) that seeks to the
keyframe before its first index and decodes forward. PyAV calls avcodec_send_packet /
avcodec_receive_frame and sws_scale inside `with nogil` (so does decord: its FFI is a
ctypes.CDLL, which drops the GIL per call), so threads run the chunks in parallel; by
default each reader decodes with one codec thread so that N readers use N cores.
"""
from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from .errors import MediaDecodeError, MediaTooLarge
from .sampling import frame_indices, smart_nframes

if TYPE_CHECKING:
    import av


@dataclass(frozen=True)
class VideoInfo:
    stream_index: int                       # container stream index decoded
    width: int
    height: int
    fps: float
    total_frames: int
    streams: tuple[tuple[int, int, int], ...]   # every video stream: (index, width, height)

    @property
    def duration_s(self) -> float:
        return self.total_frames / self.fps


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray          # [T, H, W, 3] uint8
    indices: tuple[int, ...]    # source frame index of each frame
    info: VideoInfo

    @property
    def sample_fps(self) -> float:
        """Frames per second of the sampled sequence (feeds the model's temporal RoPE)."""
        return len(self.indices) / self.info.duration_s


def _open(data: bytes) -> av.container.InputContainer:
    import av  # here, not at start-up: ~40 ms a text-only server never needs
    try:
        return av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise MediaDecodeError(f"not a decodable video ({e})") from None


def _choose(container, stream: int | None):
    import av
    videos = [s for s in container.streams.video
              if not (s.disposition & av.stream.Disposition.attached_pic)]
    if stream is not None:
        for s in videos:
            if s.index == stream:
                return s
        have = ", ".join(str(s.index) for s in videos) or "none"
        raise MediaDecodeError(f"video stream {stream} not found (video streams: {have})")
    if not videos:
        raise MediaDecodeError("the file has no video stream")
    # Largest picture wins; the first listed among equals (max keeps the first).
    return max(videos, key=lambda s: s.width * s.height)


def _frame_count(container, s, fps: float) -> int:
    if s.frames:
        return int(s.frames)
    if s.duration and s.time_base:
        return int(round(float(s.duration * s.time_base) * fps))
    if container.duration:
        return int(round(container.duration / 1e6 * fps))
    # No header says: count packets (demuxing only, no decoding).
    return sum(1 for p in container.demux(s) if p.size)


def probe(data: bytes, stream: int | None = None) -> VideoInfo:
    """Stream choice and metadata from the container header (blocking, cheap)."""
    with _open(data) as c:
        s = _choose(c, stream)
        rate = s.average_rate or s.guessed_rate or s.base_rate
        if not rate or rate <= 0:
            raise MediaDecodeError(f"video stream {s.index} has no frame rate")
        fps = float(rate)
        streams = tuple((v.index, v.width, v.height) for v in c.streams.video)
        return VideoInfo(s.index, s.width, s.height, fps, _frame_count(c, s, fps), streams)


def _read(c, s, wanted: list[int], seek: bool, rate: Fraction):
    """One forward pass; returns (frames, next wanted position, last index seen), or None
    when the seek overshot the first wanted frame (that frame is then behind us)."""
    tb = s.time_base or Fraction(1, 1)
    start = s.start_time or 0
    if seek:
        # Lands on the keyframe at or before the target; decode forward from it.
        c.seek(int(start + Fraction(wanted[0]) / rate / tb), stream=s, backward=True)
    out: list[np.ndarray | None] = [None] * len(wanted)
    k, last = 0, -1
    for frame in c.decode(s):
        # Frame index from its timestamp (after a seek there is no counter to trust).
        idx = last + 1 if frame.pts is None else round((frame.pts - start) * tb * rate)
        if last == -1 and seek and idx > wanted[0]:
            return None
        last = idx
        # The first frame at or after each wanted index stands for it, so a timestamp
        # that skips an index (variable frame rate) loses nothing.
        arr = None
        while k < len(wanted) and idx >= wanted[k]:
            arr = frame.to_ndarray(format="rgb24") if arr is None else arr
            out[k] = arr
            k += 1
        if k == len(wanted):
            break
    return out, k, last


def decode_chunk(data: bytes, info: VideoInfo, wanted: list[int], threads: int = 1,
                 dest: np.ndarray | None = None) -> np.ndarray:
    """Decode the frames at sorted source indices `wanted` with a reader of its own.
    Blocking; safe to run in several threads at once (one container each). `dest`: the
    [len(wanted), h, w, 3] slice of a caller's array to fill (readers of one video write
    their own slices in parallel, so no serial concatenation follows); returned filled."""
    import av
    rate = Fraction(info.fps).limit_denominator(1_000_000)
    with _open(data) as c:
        s = c.streams[info.stream_index]
        assert isinstance(s, av.VideoStream), "probe() chose stream_index among video streams"
        s.thread_type = "AUTO" if threads > 1 else "SLICE"
        s.codec_context.thread_count = threads
        try:
            got = _read(c, s, wanted, wanted[0] > 0, rate)
            if got is None:   # an inexact seek: read from the start instead
                c.seek(0, stream=s, backward=True)
                got = _read(c, s, wanted, False, rate)
        except av.error.FFmpegError as e:
            raise MediaDecodeError(f"corrupt video data ({e})") from None
    out, k, last = got
    if k < len(wanted):
        # Headers may count a frame or two more than the stream holds; within half a
        # second of the declared end the last frame stands in. Anything shorter is a
        # truncated file, and inventing frames for it would hide that.
        tolerance = max(1, round(info.fps / 2))
        if last < 0 or last < info.total_frames - 1 - tolerance:
            raise MediaDecodeError(f"video ended at frame {last} but frame {wanted[k]} was "
                                   f"expected (of {info.total_frames}): truncated or corrupt")
        for j in range(k, len(wanted)):
            out[j] = out[k - 1] if k > 0 else None
        if out[-1] is None:
            raise MediaDecodeError("video has no decodable frame in the requested range")
    if dest is not None and dest.shape[1:] == out[0].shape:
        for j, a in enumerate(out):
            dest[j] = a
        return dest
    return np.stack(out)


def split_chunks(indices: list[int], n: int) -> list[list[int]]:
    """`indices` into at most `n` contiguous, near-equal, non-empty runs."""
    n = max(1, min(n, len(indices)))
    q, r = divmod(len(indices), n)
    out, i = [], 0
    for j in range(n):
        size = q + (j < r)
        out.append(indices[i:i + size])
        i += size
    return out


class VideoDecoder:
    """Samples and decodes videos; `workers` readers per video, on a shared thread pool."""

    def __init__(self, *, workers: int = 2, threads_per_reader: int = 1, fps: float = 2.0,
                 min_frames: int = 4, max_frames: int = 768,
                 max_decoded_bytes: int = 2 * 2**30, frame_factor: int = 2):
        self.workers = workers
        self.threads_per_reader = threads_per_reader
        self.fps, self.min_frames, self.max_frames = fps, min_frames, max_frames
        self.max_decoded_bytes = max_decoded_bytes
        self.frame_factor = frame_factor
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mimo-video")

    @classmethod
    def from_config(cls, cfg) -> VideoDecoder:
        return cls(workers=cfg.video_decode_workers,
                   threads_per_reader=cfg.video_threads_per_reader, fps=cfg.video_fps,
                   min_frames=cfg.video_min_frames, max_frames=cfg.video_max_frames,
                   max_decoded_bytes=cfg.video_max_decoded_bytes)

    def plan(self, info: VideoInfo, *, fps: float | None = None,
             max_frames: int | None = None, nframes: int | None = None) -> list[int]:
        """The source frame indices to decode (qwen-vl-utils rules, see sampling.py)."""
        if nframes is not None and nframes > self.max_frames:
            # A fixed count bypasses the fps rule's clamp; the server's bound still holds.
            raise MediaTooLarge(f"{nframes} frames requested, over the limit of "
                                f"{self.max_frames}")
        n = smart_nframes(info.total_frames, info.fps, fps=fps or self.fps,
                          min_frames=self.min_frames,
                          max_frames=min(max_frames or self.max_frames, self.max_frames),
                          nframes=nframes, frame_factor=self.frame_factor)
        need = n * info.width * info.height * 3
        if need > self.max_decoded_bytes:
            raise MediaTooLarge(f"{n} frames of {info.width}x{info.height} need {need} "
                                f"bytes decoded, over the limit of {self.max_decoded_bytes}")
        return frame_indices(info.total_frames, n)

    async def decode(self, data: bytes, *, stream: int | None = None,
                     fps: float | None = None, max_frames: int | None = None,
                     nframes: int | None = None, workers: int | None = None) -> DecodedVideo:
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(self._pool, probe, data, stream)
        indices = self.plan(info, fps=fps, max_frames=max_frames, nframes=nframes)
        chunks = split_chunks(indices, workers or self.workers)
        # One output array, each reader filling its own slice: concatenating the readers'
        # arrays afterwards would be a serial copy of the whole video.
        frames = np.empty((len(indices), info.height, info.width, 3), np.uint8)
        bounds = np.cumsum([0] + [len(ch) for ch in chunks])
        parts = await asyncio.gather(*(
            loop.run_in_executor(self._pool, decode_chunk, data, info, ch,
                                 self.threads_per_reader, frames[lo:hi])
            for ch, lo, hi in zip(chunks, bounds[:-1], bounds[1:])))
        if any(p.base is not frames and p is not frames for p in parts):
            # A stream whose decoded frames are not width x height: stack what came back.
            frames = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return DecodedVideo(frames, tuple(indices), info)

    def decode_sync(self, data: bytes, **kw) -> DecodedVideo:
        """For callers without an event loop (benchmarks, scripts)."""
        return asyncio.run(self.decode(data, **kw))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
