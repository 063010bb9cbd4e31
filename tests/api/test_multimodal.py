"""Images and videos through the real server (tiny Qwen2.5-VL, float32) and the official
openai client: every way to send media, the same greedy output as the engine in-process,
and the embedding cache skipping the encoder for a repeated image."""
from __future__ import annotations

import base64
import re

import httpx
import pytest
from helpers.api_server import KEY_HEADER
from helpers.media import loopback_server, media_path, send

ASK = {"type": "text", "text": "What is in this picture?"}
GREEDY = dict(temperature=0, max_tokens=8)


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def data_url(name: str, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(media_path(name).read_bytes()).decode()


def noise_png(w: int, h: int) -> str:
    """A data URL of a fresh random image (never in any cache)."""
    import io
    import os

    from PIL import Image
    buf = io.BytesIO()
    Image.frombytes("RGB", (w, h), os.urandom(w * h * 3)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(client, model, parts, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": parts}], **{**GREEDY, **kw})


def tokens_for(name: str, n_images: int = 1) -> int:
    """Image tokens the model sees for a file: t*h*w/4 of its preprocessed grid."""
    from mimo.multimodal.image import decode_image
    from mimo.multimodal.preprocess import ProcessorSettings, preprocess_images
    (p,) = preprocess_images([decode_image(media_path(name).read_bytes(), 1 << 30)],
                             ProcessorSettings())
    return p.num_tokens * n_images


def counter(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10, headers=KEY_HEADER).text
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def model(vlm_dir):
    return str(vlm_dir)


def test_image_by_data_url(vlm_client, model):
    r = chat(vlm_client, model, [image(data_url("rocket.jpg", "image/jpeg")), ASK])
    assert r.choices[0].message.content is not None
    assert r.usage.completion_tokens >= 1
    # The prompt counts the expanded placeholders, as the model sees it.
    assert r.usage.prompt_tokens > tokens_for("rocket.jpg")


def test_image_by_file_url_and_plain_path(vlm_client, model):
    path = media_path("coffee.png")
    a = chat(vlm_client, model, [image(path.as_uri()), ASK])
    b = chat(vlm_client, model, [image(str(path)), ASK])
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens > tokens_for("coffee.png")


def test_image_by_http_url_needs_the_private_flag(vlm_client, vlm_strict_server, model):
    png = media_path("coffee.png").read_bytes()
    with loopback_server({"/coffee.png": lambda h: send(h, body=png)}) as (base, seen):
        r = chat(vlm_client, model, [image(base + "/coffee.png"), ASK])
        assert r.usage.prompt_tokens > tokens_for("coffee.png")
        assert [p for p, _ in seen] == ["/coffee.png"]
        # Same bytes as the file: the same answer.
        f = chat(vlm_client, model, [image(str(media_path("coffee.png"))), ASK])
        assert f.choices[0].message.content == r.choices[0].message.content
        # Loopback is a private address: refused by default, before any connection.
        strict = httpx.post(vlm_strict_server.url + "/v1/chat/completions", timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": [
                image(base + "/coffee.png"), ASK]}], "max_tokens": 4})
        assert strict.status_code == 400, strict.text
        assert re.search(r"private|loopback", strict.json()["error"]["message"], re.I)
        assert len(seen) == 1


def test_video(vlm_client, model):
    video = {"type": "video_url", "video_url": {"url": str(media_path("nasa_13013.mp4")),
                                                "max_frames": 4}}
    r = chat(vlm_client, model, [video, {"type": "text", "text": "What happens?"}])
    assert r.usage.completion_tokens >= 1
    assert r.usage.prompt_tokens > 20


def test_two_images_in_one_message(vlm_client, model):
    one = chat(vlm_client, model, [image(str(media_path("astronaut.png"))), ASK])
    two = chat(vlm_client, model, [image(str(media_path("astronaut.png"))),
                                   image(str(media_path("rocket.jpg"))), ASK])
    # The second image adds its tokens plus <|vision_start|> and <|vision_end|>.
    assert two.usage.prompt_tokens - one.usage.prompt_tokens == tokens_for("rocket.jpg") + 2


def test_greedy_output_equals_the_engine_in_process(vlm_client, vlm_dir, model):
    """The server's answer against a prompt built by hand: template text with the
    placeholder expanded to the grid's token count, the encoder run directly, MMPrompt."""
    from mimo import LLM, SamplingParams
    from mimo.models.chat_template import ChatTemplate
    from mimo.multimodal.adapters.qwen2_5_vl import build_mm_prompt
    from mimo.multimodal.image import decode_image
    from mimo.multimodal.preprocess import ProcessorSettings, preprocess_images
    path = media_path("astronaut.png")
    r = chat(vlm_client, model, [image(str(path)), ASK], max_tokens=12,
             extra_body={"ignore_eos": True})
    llm = LLM(str(vlm_dir), dtype="float32", kv_cache_memory="16MiB", progress=False)
    vc, tok = llm.engine.model_config.vision, llm.tokenizer
    (p,) = preprocess_images([decode_image(path.read_bytes(), 1 << 30)], ProcessorSettings())
    ids = ChatTemplate.for_model(tok, "qwen2_5_vl").encode(tok, [{"role": "user", "content":
        "<|vision_start|><|image_pad|><|vision_end|>" + ASK["text"]}])
    at = ids.index(vc.image_token_id)
    ids = ids[:at] + [vc.image_token_id] * p.num_tokens + ids[at + 1:]
    mmp = build_mm_prompt(ids, vc, image_embeds=[llm.engine.model.encode(p.pixel_values,
                                                                           [p.grid_thw])],
                          image_grid_thw=[p.grid_thw])
    seq = llm.engine.add_request(ids, SamplingParams(temperature=0, max_tokens=12,
                                                     ignore_eos=True), mm=mmp)
    while llm.engine.has_work():
        llm.engine.step()
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == tok.decode(seq.output_ids)


def test_repeated_image_hits_the_embed_cache_and_the_prefix_cache(vlm_client, vlm_server, model):
    parts = [image(data_url("astronaut.png", "image/png")), {"type": "text", "text": "Again?"}]
    first = chat(vlm_client, model, parts)
    hits, misses = (counter(vlm_server, f"mimo_embed_cache_{k}_total") for k in ("hits", "misses"))
    forwards = counter(vlm_server, "mimo_encoder_forwards_total")
    again = chat(vlm_client, model, parts)
    assert counter(vlm_server, "mimo_embed_cache_hits_total") == hits + 1
    assert counter(vlm_server, "mimo_embed_cache_misses_total") == misses
    assert counter(vlm_server, "mimo_encoder_forwards_total") == forwards   # encoder skipped
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    # An image never sent before, of the same size (so the same placeholder ids): no KV
    # from the image on is shared, and the encoder runs.
    other = chat(vlm_client, model, [image(noise_png(512, 512)), parts[1]])
    u = other.usage
    assert u.prompt_tokens_details.cached_tokens < u.prompt_tokens - tokens_for("astronaut.png")
    assert u.prompt_tokens == again.usage.prompt_tokens
    assert counter(vlm_server, "mimo_encoder_forwards_total") == forwards + 1


def test_streamed_image_answer_equals_the_whole_one(vlm_client, model):
    parts = [image(str(media_path("rocket.jpg"))), ASK]
    whole = chat(vlm_client, model, parts)
    stream = vlm_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": parts}], stream=True,
        stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_encoder_workers_answer_the_same_and_cache_per_worker(vlm_client, vlm_dir, media_dir,
                                                             model):
    from helpers.api_server import vlm_server_process as _vlm_server
    from openai import OpenAI
    srv = _vlm_server(vlm_dir, media_dir, "--encoder-workers", "2")
    try:
        c = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        asks = [[image(str(media_path(n))), ASK] for n in ("astronaut.png", "rocket.jpg")]
        asks.append([image(str(media_path("coffee.png"))), image(str(media_path("rocket.jpg"))),
                     ASK])
        for parts in asks:
            want = chat(vlm_client, model, parts)
            got = chat(c, model, parts)
            assert got.choices[0].message.content == want.choices[0].message.content
            assert got.usage.prompt_tokens == want.usage.prompt_tokens
        assert counter(srv, "mimo_embed_cache_misses_total") == 3      # each image once
        assert counter(srv, "mimo_embed_cache_hits_total") == 1        # rocket, 2nd time
        forwards = counter(srv, "mimo_encoder_forwards_total")
        chat(c, model, asks[2])
        assert counter(srv, "mimo_encoder_forwards_total") == forwards   # all cached
        assert counter(srv, "mimo_embed_cache_hits_total") == 3
    finally:
        srv.stop()


def test_media_flags_in_help_and_encoder_workers_checked(capsys):
    import server as server_main
    with pytest.raises(SystemExit):
        server_main.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--allowed-media-dir", "--allow-private-media-urls", "--max-media-bytes",
                 "--encoder-workers", "--image-max-pixels"):
        assert flag in out
    assert server_main.main(["--encoder-workers", "0"]) == 2
    assert "encoder_workers must be >= 1" in capsys.readouterr().err


def test_image_cap_below_the_checkpoints_minimum_is_refused(vlm_dir, capsys):
    import server as server_main
    assert server_main.main(["--model", str(vlm_dir), "--dtype", "float32",
                             "--kv-cache-memory", "4MiB", "--image-max-pixels", "1000"]) == 2
    err = capsys.readouterr().err
    assert "below the checkpoint's min_pixels=3136" in err and "Traceback" not in err


def test_tokenize_counts_media_as_generation_does(vlm_client, vlm_server, model):
    """/tokenize takes image and video messages (a 400 once) and counts them as generation
    does: the prompt_tokens of the same messages, each placeholder expanded to its rows."""
    for parts in ([image(str(media_path("rocket.jpg"))), ASK],
                  [image(str(media_path("coffee.png"))), image(str(media_path("rocket.jpg"))),
                   ASK],
                  [{"type": "video_url", "video_url": {"url": str(media_path("nasa_13013.mp4")),
                                                       "max_frames": 4}}, ASK]):
        msgs = [{"role": "user", "content": parts}]
        r = httpx.post(vlm_server.url + "/tokenize", json={"model": model, "messages": msgs},
                       timeout=120)
        assert r.status_code == 200, r.text
        got = vlm_client.chat.completions.create(model=model, messages=msgs, temperature=0,
                                                 max_tokens=1)
        assert r.json()["count"] == len(r.json()["tokens"]) == got.usage.prompt_tokens
    # a text-only count is smaller by exactly the image's rows plus its placeholder's
    text = httpx.post(vlm_server.url + "/tokenize", json={"messages": [
        {"role": "user", "content": [ASK]}]}, timeout=60).json()["count"]
    one = httpx.post(vlm_server.url + "/tokenize", json={"messages": [
        {"role": "user", "content": [image(str(media_path("rocket.jpg"))), ASK]}]},
        timeout=60).json()["count"]
    assert one > text + tokens_for("rocket.jpg")
    bad = httpx.post(vlm_server.url + "/tokenize", json={"messages": [
        {"role": "user", "content": [image("file:///etc/passwd"), ASK]}]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
