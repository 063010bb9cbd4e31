"""The server as clients meet it: the official openai client against a real process."""
import asyncio
import statistics
import time

import httpx
from helpers.api_server import KEY_HEADER

from mimo import SamplingParams
from mimo.models.chat_template import ChatTemplate

MODEL = "gemma-3-270m"
PROMPTS = ["The capital of France is", "def add(a, b):", "Water boils at", "My favourite colour",
           "In 1492,", "The quick brown fox", "import numpy as np", "Once upon a time",
           "The largest planet", "SELECT * FROM", "Dear Sir or Madam,", "The recipe calls for",
           "Photosynthesis is", "E = mc", "To be or not to be,", "The stock market"]


def offline(llm, prompt_ids, n):
    return llm.generate({"prompt_token_ids": prompt_ids},
                        SamplingParams(temperature=0, max_tokens=n))[0]


def test_completion_matches_offline_api(client, gemma_fp32, server):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    want = offline(gemma_fp32, gemma_fp32.tokenizer.encode(PROMPTS[0]), 12)
    assert r.choices[0].text == want.text
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == len(want.token_ids)
    server.assert_pools_idle()


def test_chat_matches_offline_api_streaming_and_not(client, gemma_fp32, server):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."}]
    ids = ChatTemplate.for_model(gemma_fp32.tokenizer, "gemma3").encode(gemma_fp32.tokenizer, msgs)
    want = offline(gemma_fp32, ids, 10)
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [want.finish_reason]
    server.assert_pools_idle()


def test_streamed_completion_equals_whole(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[7], max_tokens=20, temperature=0)
    parts = client.completions.create(model=MODEL, prompt=PROMPTS[7], max_tokens=20,
                                      temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in parts) == whole.choices[0].text


def test_stop_strings_cut_the_text(client, gemma_fp32):
    free = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=30, temperature=0)
    text = free.choices[0].text
    stop = text.strip()[3:6]
    assert stop and stop in text
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                      stop=[stop], stream=stream)
        got = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert got == text[:text.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                  stop=[stop])
    assert r.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_streams_are_independent(aclient, gemma_fp32, server):
    async def one(c, p):
        s = await c.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0,
                                             stream=True)
        return "".join([c.choices[0].text async for c in s])

    async def main():
        c = aclient()
        return await asyncio.gather(*(one(c, p) for p in PROMPTS))

    got = asyncio.run(main())
    tok = gemma_fp32.tokenizer
    want = gemma_fp32.generate([{"prompt_token_ids": tok.encode(p)} for p in PROMPTS],
                               SamplingParams(temperature=0, max_tokens=16))
    assert got == [w.text for w in want]
    server.assert_pools_idle()


def test_health_stays_fast_while_sixteen_streams_decode(aclient, server):
    async def stream(c, p):
        s = await c.completions.create(model=MODEL, prompt=p, max_tokens=40,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
        return [c async for c in s]

    async def main():
        c = aclient()
        tasks = [asyncio.create_task(stream(c, p)) for p in PROMPTS]
        lat = []
        async with httpx.AsyncClient() as h:
            await asyncio.sleep(1.0)               # let them all reach decode
            while not all(t.done() for t in tasks) and len(lat) < 200:
                t0 = time.perf_counter()
                r = await h.get(server.url + "/health")
                lat.append(time.perf_counter() - t0)
                assert r.status_code == 200
                await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        return lat

    lat = asyncio.run(main())
    assert len(lat) >= 20
    p99 = statistics.quantiles(lat, n=100)[98]
    assert p99 < 0.05, f"/health p99 {p99 * 1000:.1f} ms"


def test_models_health_metrics(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.url + "/metrics", headers=KEY_HEADER).text
    for name in ("mimo_requests_total", "mimo_time_to_first_token_seconds_bucket",
                 "mimo_inter_token_latency_seconds_bucket", "mimo_queue_length",
                 "mimo_kv_pool_pages", "mimo_prompt_tokens_total", "mimo_cached_prompt_tokens_total"):
        assert name in text


def test_client_disconnect_frees_kv(server):
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 400, "temperature": 0,
            "stream": True, "ignore_eos": True}
    headers = {"Authorization": "Bearer test-key"}
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", server.url + "/v1/completions", json=body, headers=headers) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
            busy = server.pools()
            assert busy["full"]["in_use"] > 0
    # The connection is closed: the request must be aborted and its pages freed promptly.
    start = server.pools()["steps"]
    server.assert_pools_idle(timeout=5.0)
    after = server.pools()["steps"]
    assert after - start < 400 - 6, "the request ran to completion instead of being aborted"


def test_repeated_prompt_reports_cached_tokens(client, gemma_fp32, server):
    prompt = ("A hybrid sliding-window model keeps full attention in a few layers and a short "
              "window in the others, so a server can cache many more tokens per byte. " * 3)
    ids = gemma_fp32.tokenizer.encode(prompt)
    before = _metric(server, "mimo_cached_prompt_tokens_total")
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    # All but the last prompt token (computed for its logits): whole 16-token pages and the
    # first rows of the page after them, copied.
    assert second.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    assert second.choices[0].text == first.choices[0].text == offline(gemma_fp32, ids, 8).text
    cached = first.usage.prompt_tokens_details.cached_tokens + len(ids) - 1
    assert _metric(server, "mimo_cached_prompt_tokens_total") - before == cached
    # The prefix cache's own totals are wired in (their values: tests/api/test_metrics.py).
    for cause in ("never_kept", "evicted"):
        assert _metric(server, f'mimo_prefix_cache_window_cut_tokens_total{{cause="{cause}"}}') >= 0
    server.assert_pools_idle()


def _metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics", headers=KEY_HEADER).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
