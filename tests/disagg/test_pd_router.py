"""`python -m mimo.router --prefill URL --decode URL --decode URL` in front of real tiny
MiMo-V2-Flash workers on 127.0.0.1: the client sees one streamed answer equal to a single
worker's, from a decode worker that took the prompt's KV from the prefill worker, with
cached_tokens true to what the prefill worker reused; concurrent requests spread over the
decode workers; with the prefill worker killed, requests still get the same answers; pools
whole and idle on every worker after."""
from __future__ import annotations

import threading

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.pd_procs import PoolsAt

from mimo.bench.router_process import RouterProcess, WorkerProcess, start_all


@pytest.fixture(scope="module")
def tiny_mimo_dir(tmp_path_factory):
    from mimo.models.tiny import mimo_v2_flash
    d = tmp_path_factory.mktemp("tiny_mimo_pd_router")
    mimo_v2_flash.write(d, seed=4)
    return str(d)


def _flags(model: str, role: str) -> list[str]:
    return ["--model", model, "--dtype", "float32", "--quantize", "none", "--kv-cache-memory",
            "64MiB", "--page-size", "16", "--threads", "1", "--metrics-public", "--role", role]


def _chat(url: str, model: str, text: str, stream: bool, max_tokens: int = 16):
    """(content, usage, response headers) of a greedy chat; streamed through SSE when asked."""
    from openai import OpenAI
    c = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": text}]
    kw = dict(model=model, messages=msgs, temperature=0, max_tokens=max_tokens,
              extra_body={"ignore_eos": True})
    if not stream:
        raw = c.chat.completions.with_raw_response.create(**kw)
        r = raw.parse()
        return r.choices[0].message.content, r.usage, raw.headers
    raw = c.chat.completions.with_raw_response.create(
        stream=True, stream_options={"include_usage": True}, **kw)
    parts, usage = [], None
    for ev in raw.parse():
        if ev.choices and ev.choices[0].delta.content:
            parts.append(ev.choices[0].delta.content)
        if ev.usage is not None:
            usage = ev.usage
    return "".join(parts), usage, raw.headers



def _kill_decode_mid_stream(url: str, model: str, decoders: dict):
    """Stream a long chat through the router, SIGKILL the decode worker serving it after its
    first event; (that worker, the SSE data lines the client received). Sampled without a
    seed, so the router does not resume it (test_pd_resume.py: greedy ones)."""
    body = {"model": model, "messages": [{"role": "user", "content": "a long one " * 20}],
            "temperature": 0.8, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    events, victim = [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line)
            if victim is None:
                victim = decoders[r.headers["x-mimo-worker"]]
                victim.kill()
    return victim, events


def _received(w) -> dict:
    return httpx.get(w.url + "/v1/internal/kv_transfers", timeout=10).json()["received"]


def test_router_pairs_prefill_and_decode(tiny_mimo_dir):
    model = tiny_mimo_dir
    procs = start_all(lambda i, wait: WorkerProcess(
        _flags(model, "prefill" if i == 0 else "decode"), wait=wait), 3)
    pre, d1, d2 = procs
    ref_worker = rt = None
    try:
        rt = RouterProcess(["--model", model, "--health-interval", "0.3", "--prefill", pre.url,
                            "--decode", d1.url, "--decode", d2.url])
        ref_worker = ServerProcess(*_flags(model, "both")[:-2])
        text = "Tell me about the lazy dog and the quick brown fox. " * 12
        ref, ref_usage, _ = _chat(ref_worker.url, model, text, stream=False)
        got, usage, headers = _chat(rt.url, model, text, stream=True)
        assert got == ref and usage.completion_tokens == ref_usage.completion_tokens == 16
        assert headers["x-mimo-prefill"] == pre.url
        assert headers["x-mimo-worker"] in (d1.url, d2.url)
        assert usage.prompt_tokens_details.cached_tokens == 0
        again, usage2, _ = _chat(rt.url, model, text, stream=False)     # prefill cache hit
        assert again == ref
        n = usage2.prompt_tokens
        assert 0 < usage2.prompt_tokens_details.cached_tokens <= n - 1
        assert _received(d1)["transfers"] + _received(d2)["transfers"] == 2
        d = httpx.post(rt.url + "/router/decide", json={"kind": "chat", "body": {
            "model": model, "messages": [{"role": "user", "content": text}]}}).json()
        assert d["prefill"] == pre.url and d["how"].startswith("pd/")
        # Two long requests at once land on different decode workers (load).
        seen: list[str] = []

        def one(i):
            seen.append(_chat(rt.url, model, f"request {i} " * 20, True, 200)[2]["x-mimo-worker"])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        assert sorted(seen) == sorted([d1.url, d2.url]), seen
        # A decode worker dies mid-stream: that client gets one clean error event (no
        # [DONE]); the next request is answered by the other decode worker.
        victim, events = _kill_decode_mid_stream(rt.url, model, {d1.url: d1, d2.url: d2})
        assert sum('"error"' in e for e in events) == 1 and "[DONE]" not in events[-1]
        survivor = d2 if victim is d1 else d1
        got4, _, h4 = _chat(rt.url, model, text, stream=True)
        assert got4 == ref and h4["x-mimo-worker"] == survivor.url
        PoolsAt(pre.url).assert_pools_idle()
        # The prefill worker dies: the answer stays the same (recomputed on a decode worker,
        # or sent whole once the router sees it down).
        pre.kill()
        got3, usage3, _ = _chat(rt.url, model, text, stream=True)
        assert got3 == ref and usage3.completion_tokens == 16
        PoolsAt(survivor.url).assert_pools_idle()
    finally:
        for p in (rt, ref_worker, *procs):
            if p is not None:
                p.stop()
