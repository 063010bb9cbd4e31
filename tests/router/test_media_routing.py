"""Prompts with images routed by affinity: tiny Qwen2.5-VL workers publishing to a real Redis,
the router keying a chat request's data: URL images in the workers' media namespace (their
bytes' digest, their header's size and EXIF orientation). The same image goes back to the
worker that holds it, predicted exactly; the same text with another image is another key
space, scored on its own; an image the router cannot see (an http URL) is load-only."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from .conftest import (
    chat_raw,
    decide,
    decide_when_published,
    start_router,
    stop_all,
    wait_published,
    whole_pages,
)

HB = "0.2"


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from mimo.models.tiny import qwen2_5_vl
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl_router")
    qwen2_5_vl.write(d, seed=3)
    return d


def data_url(seed: int, size=(112, 84), fmt="PNG", orientation: int | None = None) -> str:
    px = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(px)
    buf = io.BytesIO()
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    im.save(buf, fmt, **kw)
    mime = "image/png" if fmt == "PNG" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def messages(url: str, text: str, system: str = "look closely at the picture. " * 8):
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def vl_cluster(vlm_dir):
    from helpers.redis_servers import RedisServer

    from mimo.bench.router_process import WorkerProcess, start_all
    r = RedisServer()
    ws = rt = None
    try:
        flags = ["--model", str(vlm_dir), "--dtype", "float32", "--kv-cache-memory", "32MiB",
                 "--threads", "1", "--router-heartbeat", HB, "--router-redis", r.url]
        ws = start_all(lambda i, wait: WorkerProcess(flags, wait=wait), 3)
        wait_published(r.url, ws)
        rt = start_router(vlm_dir, r.url, ws)
        yield ws, rt
    finally:
        stop_all(rt, ws)
        r.stop()


def _send(rt, model, msgs, holder: str | None = None):
    """(decision, usage, worker) for one request: decided (once `holder`'s cache is
    published, when given), then sent through the router."""
    body = {"model": model, "messages": msgs, "max_tokens": 3}
    d = decide(rt, body) if holder is None else decide_when_published(rt, body, holder)
    resp, w = chat_raw(rt, model, msgs, max_tokens=3)
    return d, resp.usage, w


def test_the_same_image_goes_back_to_its_worker(vl_cluster, vlm_dir):
    ws, rt = vl_cluster
    model = str(vlm_dir)
    x = data_url(1)
    d, u, wx = _send(rt, model, messages(x, "what is in it?"))
    assert d["worker"] == wx and d["prompt_tokens"] == u.prompt_tokens
    assert u.prompt_tokens_details.cached_tokens == 0
    # The same image again (another question): the worker that holds it, predicted exactly.
    for q in ("and the colours?", "and the corners?"):
        d, u, w = _send(rt, model, messages(x, q), holder=wx)
        assert w == wx == d["worker"], d
        assert d["predicted_cached_tokens"] == whole_pages(u.prompt_tokens_details.cached_tokens) > 0
        assert d["prompt_tokens"] == u.prompt_tokens
    # Another image with the same text: its own key space, nothing credited.
    y = data_url(2)
    d = decide(rt, {"model": model, "messages": messages(y, "what is in it?"), "max_tokens": 3})
    assert d["predicted_cached_tokens"] == 0 and d["how"] == "score"
    _, u, wy = _send(rt, model, messages(y, "what is in it?"))
    assert u.prompt_tokens_details.cached_tokens == 0
    d, u, w = _send(rt, model, messages(y, "and the colours?"), holder=wy)
    assert w == wy and d["predicted_cached_tokens"] == whole_pages(u.prompt_tokens_details.cached_tokens) > 0


def test_exif_rotated_jpeg_and_unseen_images(vl_cluster, vlm_dir):
    ws, rt = vl_cluster
    model = str(vlm_dir)
    # A JPEG stored 140 x 56 and turned a quarter by its EXIF tag: the worker sees 56 x 140,
    # the router reads only the header; the token counts agree.
    z = data_url(3, size=(140, 56), fmt="JPEG", orientation=6)
    d, u, wz = _send(rt, model, messages(z, "which way is up?"))
    assert d["prompt_tokens"] == u.prompt_tokens
    d, u, w = _send(rt, model, messages(z, "and now?"), holder=wz)
    assert w == wz and d["predicted_cached_tokens"] == whole_pages(u.prompt_tokens_details.cached_tokens) > 0
    # An image at an http URL: the router fetches nothing, the prompt is unknown to it.
    d = decide(rt, {"model": model, "messages": messages("http://127.0.0.1:9/x.png", "hi"),
                    "max_tokens": 3})
    assert d["predicted_cached_tokens"] == 0 and d["prompt_tokens"] == 0


def test_a_salted_image_prompt_is_predicted_only_under_its_salt(vl_cluster, vlm_dir):
    # Media hash and salt together: the router keys the prompt in the worker's namespace for
    # both, so the same image and text under another salt (or none) is predicted cold, and
    # the worker indeed reuses nothing; under its own salt the prediction is exact.
    ws, rt = vl_cluster
    model = str(vlm_dir)
    x = data_url(4)

    def body(q, **kw):
        return {"model": model, "messages": messages(x, q), "max_tokens": 3, **kw}
    alice = {"extra_body": {"cache_salt": "alice"}}
    _, wx = chat_raw(rt, model, messages(x, "what is it?"), **alice)
    d = decide_when_published(rt, body("and the edges?", cache_salt="alice"), wx)
    resp, w = chat_raw(rt, model, messages(x, "and the edges?"), **alice)
    assert w == wx and d["predicted_cached_tokens"] == \
        whole_pages(resp.usage.prompt_tokens_details.cached_tokens) > 0
    for kw in ({"cache_salt": "bob"}, {}):
        d = decide(rt, body("and the middle?", **kw))
        assert d["predicted_cached_tokens"] == 0, kw
        resp, _ = chat_raw(rt, model, messages(x, "and the middle?"), extra_body=kw)
        assert resp.usage.prompt_tokens_details.cached_tokens == 0, kw
