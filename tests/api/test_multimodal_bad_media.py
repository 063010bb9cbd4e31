"""Bad media through the real server: each a 400 whose message says what is wrong with
which item, and the server answers the next image request with its KV pools idle."""
from __future__ import annotations

import base64
import struct
import zlib

import httpx
import pytest
from helpers.api_server import MAX_MEDIA_BYTES
from helpers.media import loopback_server, media_path, send


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height and holds almost no data (a decompression bomb's
    header): the server must refuse it from the header, not try to decode it."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def b64(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url, "max_frames": 4}}


@pytest.fixture(scope="module")
def media_http():
    """A loopback HTTP server with the bad downloads."""
    mp4 = media_path("nasa_13013.mp4").read_bytes()
    routes = {
        "/truncated.mp4": lambda h: send(h, body=mp4[:len(mp4) // 3]),
        "/loop": lambda h: send(h, 302, headers={"Location": "/loop"}),
        "/big.png": lambda h: send(h, body=b"\0" * (MAX_MEDIA_BYTES + 100_000)),
        "/ok.png": lambda h: send(h, body=media_path("coffee.png").read_bytes()),
    }
    with loopback_server(routes) as (base, seen):
        yield base, seen


# (case, content part maker given the loopback base URL, strict server?, message pattern)
CASES = [
    ("corrupt-image", lambda b: image(b64("image/png", b"\x89PNG\r\n\x1a\n" + b"junk" * 100)),
     False, r"image 1 of 1: .*(decode|corrupt|not an image|cannot identify|truncated)"),
    ("truncated-video", lambda b: video(b + "/truncated.mp4"), False,
     r"video 1 of 1: .*(decodable|truncated|invalid)"),
    ("png-bomb-header", lambda b: image(b64("image/png", png_header_only(100_000, 100_000))),
     False, r"image 1 of 1: .*(100000x100000|10000000000|pixels)"),
    ("private-address", lambda b: image(b + "/ok.png"), True,
     r"image 1 of 1: .*(private|loopback)"),
    ("redirect-loop", lambda b: image(b + "/loop"), False, r"image 1 of 1: .*redirect"),
    ("too-large-download", lambda b: image(b + "/big.png"), False,
     rf"image 1 of 1: .*({MAX_MEDIA_BYTES}|too large|over|limit)"),
    ("unsupported-scheme", lambda b: image("ftp://127.0.0.1/a.png"), False,
     r"image 1 of 1: .*(scheme|ftp)"),
    ("path-outside-allowed-dir", lambda b: image("/etc/hostname"), False,
     r"image 1 of 1: .*(allowed|outside|not under)"),
    ("file-url-outside-allowed-dir", lambda b: image("file:///etc/passwd"), False,
     r"image 1 of 1: .*(allowed|outside|not under)"),
]


def post(server, model, parts, **kw):
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": parts}], **kw})


@pytest.mark.parametrize("case,part,strict,says", CASES, ids=[c[0] for c in CASES])
def test_bad_media_is_a_400_and_the_server_recovers(case, part, strict, says, media_http,
                                                    vlm_server, vlm_strict_server, vlm_dir):
    import re
    server = vlm_strict_server if strict else vlm_server
    base, _ = media_http
    model = str(vlm_dir)
    r = post(server, model, [part(base), {"type": "text", "text": "What is it?"}])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert re.search(says, err["message"], re.I), err["message"]
    server.assert_pools_idle()
    ok = post(server, model, [image(str(media_path("rocket.jpg"))),
                              {"type": "text", "text": "And this?"}])
    assert ok.status_code == 200, ok.text
    server.assert_pools_idle()


def test_one_bad_item_fails_the_request_naming_it(vlm_server, vlm_dir):
    good = image(str(media_path("rocket.jpg")))
    r = post(vlm_server, str(vlm_dir), [good, image(b64("image/png", b"not a png"))])
    assert r.status_code == 400 and "image 2 of 2" in r.json()["error"]["message"]


@pytest.mark.parametrize("part,says", [
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
     "unsupported content part 'input_audio'"),
    ({"type": "image_url", "image_url": {}}, "image_url.url is missing"),
    ({"type": "image_url"}, "image_url must be an object"),
    ({"type": "video_url", "video_url": {"url": "x.mp4", "fps": -1}}, "fps must be a positive"),
    ({"type": "video_url", "video_url": {"url": "x.mp4", "max_frames": 1.5}},
     "max_frames must be a positive integer"),
], ids=["unknown-type", "missing-url", "no-image-url-object", "bad-fps", "bad-max-frames"])
def test_malformed_parts_are_400s(part, says, vlm_server, vlm_dir):
    r = post(vlm_server, str(vlm_dir), [part, {"type": "text", "text": "Hi"}])
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages"


def test_placeholder_text_without_media_is_a_400(vlm_server, vlm_dir):
    r = post(vlm_server, str(vlm_dir), "What is <|image_pad|> here?")
    assert r.status_code == 400, r.text
    assert "placeholder" in r.json()["error"]["message"]


def test_media_in_an_assistant_message_is_a_400(vlm_server, vlm_dir):
    r = httpx.post(vlm_server.url + "/v1/chat/completions", timeout=60, json={
        "model": str(vlm_dir), "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [image(str(media_path("rocket.jpg")))]},
            {"role": "user", "content": "Well?"}]})
    assert r.status_code == 400 and "user messages only" in r.json()["error"]["message"]


def test_text_only_model_refuses_media_naming_the_part():
    from mimo.api import schemas
    from mimo.api.errors import APIError
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look"}, image("data:image/png;base64,AAAA")]}]}
    with pytest.raises(APIError) as e:
        schemas.parse("chat", body, 1024, multimodal=False)
    assert e.value.status == 400
    assert "messages[0].content[1]" in e.value.message and "text-only" in e.value.message
    spec = schemas.parse("chat", body, 1024, multimodal=True)
    assert [m.kind for m in spec.media] == ["image"]
    assert spec.messages[0]["content"] == [{"type": "text", "text": "Look"}, {"type": "image"}]
