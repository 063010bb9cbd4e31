"""Video decoding: stream choice, chunked parallel readers vs references, bad input."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import av
import numpy as np
import pytest
from helpers.media import media_path
from helpers.video import write_video

from mimo.multimodal.errors import MediaDecodeError, MediaTooLarge
from mimo.multimodal.video import VideoDecoder, probe, split_chunks


def decode(data, **kw):
    workers = kw.pop("workers", 2)
    dec = VideoDecoder(workers=workers, max_decoded_bytes=kw.pop("max_decoded_bytes", 2**30))
    try:
        return asyncio.run(dec.decode(data, **kw))
    finally:
        dec.close()


def test_the_server_starts_without_pyav():
    """PyAV (~40 ms to import) is imported by the first video, not at the server's start."""
    code = "import sys, mimo.api.app, mimo.multimodal.video; print('av' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def sequential_reference(data: bytes, stream: int, indices) -> np.ndarray:
    """Every frame of the stream decoded in order, no seeking, picked by position."""
    import io
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams[stream])]
    return np.stack([frames[i] for i in indices])


def test_stream_selection_on_two_stream_file():
    data = media_path("nasa_13013.mp4").read_bytes()
    info = probe(data)
    assert info.streams == ((0, 320, 180), (3, 480, 270))
    assert (info.stream_index, info.width, info.height, info.total_frames) == (3, 480, 270, 390)
    assert abs(info.fps - 30000 / 1001) < 1e-9

    best = decode(data)
    assert best.frames.shape == (26, 270, 480, 3) and best.info.stream_index == 3
    # decord (FFmpeg's own best-stream pick) is an independent reader of the same frames.
    decord = pytest.importorskip("decord")
    vr = decord.VideoReader(str(media_path("nasa_13013.mp4")))
    assert vr[0].shape == (270, 480, 3)
    np.testing.assert_array_equal(best.frames, vr.get_batch(list(best.indices)).asnumpy())

    small = decode(data, stream=0, workers=3)
    assert small.frames.shape == (26, 180, 320, 3) and small.info.total_frames == 325
    np.testing.assert_array_equal(small.frames, sequential_reference(data, 0, small.indices))

    for bad in (1, 2, 7):   # audio, subtitles, absent
        with pytest.raises(MediaDecodeError, match=f"stream {bad} not found"):
            decode(data, stream=bad)


def test_chunked_readers_match_one_reader(tmp_path):
    data = write_video(tmp_path / "v.mp4", frames=120, gop=12).read_bytes()
    one = decode(data, workers=1, nframes=40)
    for w in (2, 3, 7):
        many = decode(data, workers=w, nframes=40)
        assert many.indices == one.indices
        np.testing.assert_array_equal(many.frames, one.frames)
    np.testing.assert_array_equal(one.frames, sequential_reference(data, 0, one.indices))
    # The frame-number marker survives encoding closely enough to read back.
    marks = one.frames[:, 2:6, 2:6].mean(axis=(1, 2, 3))
    assert np.all(np.abs(marks - np.array(one.indices)) < 6)


def test_split_chunks():
    idx = list(range(10))
    assert split_chunks(idx, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split_chunks(idx[:2], 5) == [[0], [1]]
    assert sum(split_chunks(idx, 4), []) == idx


def test_truncated_videos(tmp_path):
    nasa = media_path("nasa_13013.mp4").read_bytes()
    with pytest.raises(MediaDecodeError):          # index (moov) at the end: cut away
        decode(nasa[: len(nasa) // 2])
    # Index at the front (faststart): it opens fine and promises frames that are gone.
    data = write_video(tmp_path / "fs.mp4", frames=90, gop=10, faststart=True).read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")
    assert decode(data).frames.shape[0] == 6
    with pytest.raises(MediaDecodeError, match="truncated|corrupt"):
        decode(data[: len(data) * 6 // 10])


def test_garbage_and_limits():
    with pytest.raises(MediaDecodeError, match="not a decodable video"):
        decode(b"\x00\x01garbage" * 1000)
    with pytest.raises(MediaDecodeError):
        decode(media_path("astronaut.png").read_bytes())   # an image has no video stream
    data = media_path("nasa_13013.mp4").read_bytes()
    with pytest.raises(MediaTooLarge, match="26 frames of 480x270"):
        decode(data, max_decoded_bytes=1_000_000)
    with pytest.raises(MediaTooLarge, match="1000 frames requested"):
        decode(data, nframes=1000)


def test_frame_count_overstated_by_header(tmp_path):
    """A header that counts a frame more than the stream holds is tolerated (last frame
    repeated); one that promises far more frames is a truncated file."""
    import dataclasses

    from mimo.multimodal.video import decode_chunk
    data = write_video(tmp_path / "v.mp4", frames=30, gop=10).read_bytes()
    info = probe(data)
    assert info.total_frames == 30
    real = decode_chunk(data, info, [20, 29])
    off_by_one = dataclasses.replace(info, total_frames=31)
    got = decode_chunk(data, off_by_one, [20, 29, 30])
    np.testing.assert_array_equal(got[:2], real)
    np.testing.assert_array_equal(got[2], real[1])
    with pytest.raises(MediaDecodeError, match="truncated"):
        decode_chunk(data, dataclasses.replace(info, total_frames=90), [20, 60, 89])
