"""Fetch -> DecodeMedia -> Preprocess as a pipeline: results equal the direct functions,
items and requests download concurrently, and a bad item fails only its request."""
from __future__ import annotations

import asyncio
import base64
import time

import pytest
import torch
from helpers.media import MEDIA_DIR, loopback_server, media_path, send

from mimo.multimodal.config import MediaConfig
from mimo.multimodal.errors import MediaDecodeError, MediaForbidden
from mimo.multimodal.image import decode_image
from mimo.multimodal.item import MediaItem
from mimo.multimodal.preprocess import ProcessorSettings, preprocess_images, preprocess_video
from mimo.multimodal.video import VideoDecoder
from mimo.pipeline import Pipeline, StageError
from mimo.stages import ChatRequest
from mimo.stages.decode_media import DecodeMedia
from mimo.stages.fetch import Fetch
from mimo.stages.preprocess import Preprocess


def make_pipeline(cfg: MediaConfig, settings=ProcessorSettings()):
    return Pipeline([Fetch(cfg), DecodeMedia(cfg), Preprocess(settings)])


def slow(seconds, body):
    def route(h):
        time.sleep(seconds)
        send(h, body=body)
    return route


def test_pipeline_end_to_end():
    png = media_path("astronaut.png").read_bytes()
    jpg = media_path("rocket.jpg").read_bytes()
    mp4 = media_path("nasa_13013.mp4").read_bytes()
    cfg = MediaConfig(allow_private=True, allowed_media_dirs=(str(MEDIA_DIR),))
    with loopback_server({"/a.png": lambda h: send(h, body=png)}) as (base, _):
        items = [MediaItem("image", base + "/a.png"),
                 MediaItem("image", "data:image/jpeg;base64," + base64.b64encode(jpg).decode()),
                 MediaItem("video", str(media_path("nasa_13013.mp4")), stream=0),
                 MediaItem("image", f"file://{media_path('astronaut.png')}")]

        async def main():
            async with make_pipeline(cfg) as p:
                req = ChatRequest(media=items)
                assert await p.run(req) is None       # the stages fill the request
                return req.preprocessed, req
        out, req = asyncio.run(main())
    assert [o.kind for o in out] == ["image", "image", "video", "image"]
    want_imgs = preprocess_images([decode_image(png, 1 << 30), decode_image(jpg, 1 << 30)])
    for got, want in zip(out[:2], want_imgs):
        assert got.patches.grid_thw == want.grid_thw
        assert torch.equal(got.patches.pixel_values, want.pixel_values)
    # Same bytes from two places, same cache key; different bytes, different key.
    assert out[0].key == out[3].key != out[1].key
    dec = VideoDecoder()
    try:
        v = dec.decode_sync(mp4, stream=0)
    finally:
        dec.close()
    want_v = preprocess_video(v.frames)
    assert out[2].patches.grid_thw == want_v.grid_thw == (13, 18, 32)   # 180x320 raised to 252x448
    assert torch.equal(out[2].patches.pixel_values, want_v.pixel_values)
    assert out[2].second_per_grid == pytest.approx(2 / 2.0)   # 26 frames over 13 s
    assert set(req.timings) == {"fetch", "decode_media", "preprocess"}


def test_downloads_run_concurrently():
    png = media_path("coffee.png").read_bytes()
    cfg = MediaConfig(allow_private=True)
    with loopback_server({"/slow.png": slow(0.6, png)}) as (base, seen):
        async def main():
            async with make_pipeline(cfg) as p:
                reqs = [ChatRequest(media=[MediaItem("image", base + f"/slow.png?r={r}&i={i}")
                                           for i in range(2)]) for r in range(3)]
                t0 = time.perf_counter()
                await asyncio.gather(*(p.run(r) for r in reqs))
                return [r.preprocessed for r in reqs], reqs, time.perf_counter() - t0
        outs, reqs, elapsed = asyncio.run(main())
    assert len(seen) == 6 and all(len(o) == 2 for o in outs)
    # Six 0.6 s downloads, sequentially 3.6 s; concurrently about 0.6 s (plus decode).
    fetch_times = [r.timings["fetch"].ran for r in reqs]
    assert max(fetch_times) < 1.8, fetch_times
    assert elapsed < 3.0


def test_bad_item_fails_its_request_only():
    png = media_path("coffee.png").read_bytes()
    cfg = MediaConfig(allow_private=False)

    async def resolver(host, port):
        return {"ok.example": ["93.184.216.34"], "meta.example": ["169.254.169.254"]}[host]

    class Server:   # stands in for the network: only ok.example answers
        async def handle_async_request(self, request):
            import httpx
            assert request.url.host == "93.184.216.34"
            return httpx.Response(200, content=png)

    import httpx

    class T(httpx.AsyncBaseTransport):
        handle_async_request = Server.handle_async_request

    async def main():
        p = Pipeline([Fetch(cfg, resolver=resolver, transport=T()), DecodeMedia(cfg),
                      Preprocess()])
        async with p:
            good = ChatRequest(media=[MediaItem("image", "http://ok.example/c.png")])
            bad = ChatRequest(media=[MediaItem("image", "http://ok.example/c.png"),
                                     MediaItem("image", "http://meta.example/x")])
            corrupt = ChatRequest(media=[MediaItem("image", "data:,not-an-image")])
            out = await asyncio.gather(p.run(good), p.run(bad), p.run(corrupt),
                                       return_exceptions=True)
            return good.preprocessed, *out[1:]
    good, bad, corrupt = asyncio.run(main())
    assert len(good) == 1 and good[0].patches.grid_thw == (1, 28, 42)
    # The stages keep the typed media error (the API maps it to a 400), naming the item.
    assert isinstance(bad, StageError) and bad.stage == "fetch"
    assert isinstance(bad.cause, MediaForbidden)
    assert "image 2 of 2" in str(bad.cause) and "169.254.169.254" in str(bad.cause)
    assert isinstance(corrupt, StageError) and corrupt.stage == "decode_media"
    assert isinstance(corrupt.cause, MediaDecodeError)
    assert "not a decodable image" in str(corrupt.cause)


def test_no_media_is_a_no_op():
    async def main():
        async with make_pipeline(MediaConfig()) as p:
            req = ChatRequest()
            await p.run(req)
            return req
    req = asyncio.run(main())
    assert req.fetched == [] and req.decoded == [] and req.preprocessed == []
