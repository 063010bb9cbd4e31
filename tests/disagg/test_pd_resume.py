"""A decode worker SIGKILLed after its first streamed bytes, behind the router, with real
processes on 127.0.0.1 (tiny MiMo-V2-Flash, float32): a greedy stream (completion, chat) or
a seeded sampled one is re-issued to another decode worker and continued where the client
was (its text is the single worker's answer, one id throughout, one [DONE], no error); a
sampled stream without a seed ends with one SSE error although a worker is up, and so does
a greedy one once no worker is left. The surviving pools end idle."""
from __future__ import annotations

import json

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.pd_procs import assert_idle, pd_flags, wait_paired, write_tiny_mimo

from mimo.bench.router_process import RouterProcess, WorkerProcess

PROMPT = [(5 * j) % 300 + 20 for j in range(200)]
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_mimo(tmp_path_factory, "tiny_mimo_pd_resume")






def _body(model: str, chat: bool, **kw) -> dict:
    b = {"model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True, **kw}
    if chat:
        b["messages"] = [{"role": "user", "content": "tell me " * 40}]
    else:
        b["prompt"] = PROMPT
    return b


def _text(ev: dict) -> str:
    ch = ev["choices"][0]
    return ch["text"] if "text" in ch else (ch["delta"].get("content") or "")


def _stream_killing(url: str, path: str, body: dict, workers: dict, after: int
                    ) -> tuple[list[str], str]:
    """Stream `body`; SIGKILL the serving worker once `after` content events arrived.
    The raw data payloads and the serving worker's URL."""
    out: list[str] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        served = r.headers["x-mimo-worker"]
        seen = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            out.append(line[6:])
            if line[6:].startswith("{") and json.loads(line[6:]).get("choices"):
                seen += 1
                if seen == after:
                    workers[served].kill()
    return out, served


def _resumed(router: str) -> float:
    text = httpx.get(router + "/metrics", timeout=10).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("mimo_router_resumed_streams_total"))


def test_greedy_stream_resumes_on_another_decode_worker(model):
    ref = ServerProcess(*pd_flags(model))
    try:
        want = {chat: _whole(ref.url, model, chat) for chat in (False, True)}
        seeded = _whole(ref.url, model, False, temperature=1.0, seed=7)
        assert seeded != want[False]
        assert min(len(v) for v in want.values()) > 20, want
    finally:
        ref.stop()
    pre = WorkerProcess(pd_flags(model, "--role", "prefill"))
    decs: list[WorkerProcess] = []
    rt = None
    try:
        decs = [WorkerProcess(pd_flags(model, "--role", "decode")) for _ in range(4)]
        workers = {w.url: w for w in decs}
        rt = RouterProcess(["--model", model, "--health-interval", "0.3", "--prefill",
                            pre.url, *(a for w in decs for a in ("--decode", w.url))])
        for w in decs:
            wait_paired(rt.url, model, pre.url, w.url, PROMPT)
        # Greedy completion, greedy chat, a seeded sampled completion: each serving decode
        # worker dies mid-stream.
        usage = {"stream_options": {"include_usage": True}}
        cases = [("/v1/completions", _body(model, False, temperature=0, **usage), want[False]),
                 ("/v1/chat/completions", _body(model, True, temperature=0), want[True]),
                 ("/v1/completions", _body(model, False, temperature=1.0, seed=7), seeded)]
        for n, (path, body, expect) in enumerate(cases, 1):
            data, served = _stream_killing(rt.url, path, body, workers, after=5)
            assert served in workers and not workers.pop(served).alive()
            assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
            assert not any('"error"' in x for x in data)
            evs = [json.loads(x) for x in data[:-1]]
            assert len({ev["id"] for ev in evs}) == 1
            assert len({ev["created"] for ev in evs}) == 1
            assert "".join(_text(ev) for ev in evs if ev["choices"]) == expect
            if "stream_options" in body:        # one usage event, the new worker's, last
                assert [ev["usage"]["completion_tokens"] for ev in evs
                        if not ev["choices"]] == [MAX_TOKENS] and not evs[-1]["choices"]
            assert _resumed(rt.url) == n
            assert_idle(pre, *workers.values())
        # A sampled stream without a seed is not resumed: one SSE error, no [DONE], though
        # the prefill worker is up (it would serve a new request whole).
        (survivor,) = workers.values()
        data, served = _stream_killing(rt.url, "/v1/chat/completions",
                                       _body(model, True, temperature=1.0), workers, after=5)
        assert served == survivor.url and not survivor.alive()
        assert "[DONE]" not in data and sum('"error"' in x for x in data) == 1
        assert json.loads(data[-1])["error"]["code"] == "worker_failed"
        assert _resumed(rt.url) == 3
        assert_idle(pre)
        # The prefill worker, the last one, serves a greedy stream whole and dies under it:
        # no worker to resume on, one SSE error.
        data, served = _stream_killing(rt.url, "/v1/completions",
                                       _body(model, False, temperature=0), {pre.url: pre},
                                       after=5)
        assert served == pre.url and not pre.alive()
        assert "[DONE]" not in data and sum('"error"' in x for x in data) == 1
        assert "no other worker" in json.loads(data[-1])["error"]["message"]
        assert _resumed(rt.url) == 3
    finally:
        for p in (rt, *decs, pre):
            if p is not None:
                p.stop()


def _whole(url: str, model: str, chat: bool, **kw) -> str:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = httpx.post(url + path, json=_body(model, chat, **{"temperature": 0, **kw}), timeout=300)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    return ch["text"] if not chat else ch["message"]["content"]
