"""The tiers behind the real server (processes on 127.0.0.1, the official openai client),
tiny Gemma 3 and tiny Qwen2.5-VL checkpoints in float32: a long prompt (over 4,000 tokens,
hundreds of windows long) comes back with the cache-off answer and its cached tokens from
the disk tier after the server restarted, and from Redis in a second server that never saw
it; an image prompt hits for the same image from storage and not for another one."""
from __future__ import annotations

import base64
import re

import httpx
import pytest
import torch
from helpers.media import media_path
from helpers.redis_servers import RedisServer

from mimo import LLM, SamplingParams
from mimo.bench.server_process import ServerProcess

N, PAGE = 4050, 4
FLAGS = ["--dtype", "float32", "--kv-cache-memory", "8MiB", "--page-size", str(PAGE)]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from mimo.models.tiny import gemma3
    d = tmp_path_factory.mktemp("tiny_gemma3_tiers")
    gemma3.write(d, seed=5)
    return d


@pytest.fixture(scope="module")
def prompt():
    g = torch.Generator().manual_seed(3)
    return torch.randint(10, 400, (N,), generator=g).tolist()


@pytest.fixture(scope="module")
def reference(gemma_dir, prompt):
    llm = LLM(str(gemma_dir), dtype="float32", prefix_cache=False, progress=False)
    return llm.generate({"prompt_token_ids": prompt},
                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].text


def complete(server, prompt):
    from openai import OpenAI
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    return client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})


def metric(server, name: str, **labels) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}\{{{lab}\}} ([0-9.e+]+)$" if lab else rf"^{name} ([0-9.e+]+)$",
                  text, re.M)
    assert m, f"{name}{{{lab}}} not in /metrics"
    return float(m.group(1))


def serve(model_dir, *extra):
    return ServerProcess(["--model", str(model_dir), *FLAGS, *extra], start_timeout=180)


def test_disk_tier_after_the_server_restarted(gemma_dir, prompt, reference, tmp_path):
    store = f"file:{tmp_path}"
    first = serve(gemma_dir, "--kv-storage", store)
    try:
        out = complete(first, prompt)
        assert out.choices[0].text == reference
        assert out.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        first.stop()                    # a graceful stop lands the queued writes
    second = serve(gemma_dir, "--kv-storage", store)
    try:
        out = complete(second, prompt)
        assert out.choices[0].text == reference
        assert out.usage.prompt_tokens_details.cached_tokens == (N - 1) // PAGE * PAGE
        assert metric(second, "mimo_kv_tier_hit_tokens_total", tier="l3") == (N - 1) // PAGE * PAGE
    finally:
        second.stop()


def test_redis_from_a_second_server_that_never_saw_the_prompt(gemma_dir, prompt, reference):
    with RedisServer() as redis:
        a = serve(gemma_dir, "--kv-storage", redis.url)
        b = serve(gemma_dir, "--kv-storage", redis.url, "--host-kv-cache-memory", "16MiB")
        try:
            assert complete(a, prompt).choices[0].text == reference
            deadline = 30
            import time
            t0 = time.time()
            while metric(a, "mimo_kv_tier_written_bytes_total", tier="l3") == 0:
                assert time.time() - t0 < deadline, "nothing written to Redis"
                time.sleep(0.1)
            time.sleep(0.5)             # (the rest of the queued batches)
            out = complete(b, prompt)
            assert out.choices[0].text == reference
            assert out.usage.prompt_tokens_details.cached_tokens == (N - 1) // PAGE * PAGE
            assert metric(b, "mimo_kv_storage_errors_total", cause="corrupt") == 0
        finally:
            a.stop()
            b.stop()


def _image(name: str) -> dict:
    url = "data:image/png;base64," + base64.b64encode(media_path(name).read_bytes()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_an_image_prompt_hits_for_the_same_image_only(tmp_path_factory, tmp_path):
    from openai import OpenAI

    from mimo.models.tiny import qwen2_5_vl
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl_tiers")
    qwen2_5_vl.write(d, seed=3)
    store = f"file:{tmp_path}"
    ask = {"type": "text", "text": "What is in this picture?"}

    def chat(server, img):
        c = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        return c.chat.completions.create(model=str(d), temperature=0, max_tokens=8,
                                         messages=[{"role": "user", "content": [img, ask]}])
    first = ServerProcess(["--model", str(d), "--dtype", "float32", "--kv-cache-memory",
                           "64MiB", "--kv-storage", store], start_timeout=180)
    try:
        want = chat(first, _image("astronaut.png"))
    finally:
        first.stop()
    second = ServerProcess(["--model", str(d), "--dtype", "float32", "--kv-cache-memory",
                            "64MiB", "--kv-storage", store], start_timeout=180)
    try:
        same = chat(second, _image("astronaut.png"))
        assert same.choices[0].message.content == want.choices[0].message.content
        u = same.usage
        assert u.prompt_tokens_details.cached_tokens >= (u.prompt_tokens - 1) // 16 * 16 - 16
        other = chat(second, _image("coffee.png"))
        from mimo.multimodal.image import decode_image
        from mimo.multimodal.preprocess import ProcessorSettings, preprocess_images
        (p,) = preprocess_images([decode_image(media_path("coffee.png").read_bytes(), 1 << 30)],
                                 ProcessorSettings())
        v = other.usage
        assert v.prompt_tokens_details.cached_tokens < v.prompt_tokens - p.num_tokens
    finally:
        second.stop()
