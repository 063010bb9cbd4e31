"""Redis SIGKILLed mid-request in a PD deployment, real processes on 127.0.0.1 (tiny
MiMo-V2-Flash, float32): one prefill and two decode workers publishing their caches to one
real redis-server (`--router-redis`), the router's shared state in it (`--redis`). Redis dies
while greedy requests, streamed and whole, are in flight: every client gets the single
worker's answer, decisions fall back to local hashing (still paired), requests keep
answering; once Redis is back the workers republish and the router scores again. Pools
end idle."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.pd_procs import PoolsAt, pd_flags, write_tiny_mimo
from helpers.redis_servers import RedisServer

from mimo.bench.router_process import RouterProcess, WorkerProcess

PROMPTS = [[(11 * i + 3 * j) % 350 + 15 for j in range(180 + 30 * i)] for i in range(6)]
MAX_TOKENS = 150


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_mimo(tmp_path_factory, "tiny_mimo_pd_redis")






def _ask(url: str, model: str, prompt, stream: bool) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["text"]
    data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]" and not any('"error"' in x for x in data), data[-3:]
    return "".join(ev["choices"][0]["text"] for ev in map(json.loads, data[:-1])
                   if ev.get("choices"))


def _how(router: str, model: str, prompt) -> str:
    body = {"kind": "completion", "body": {"model": model, "prompt": prompt}}
    return httpx.post(router + "/router/decide", json=body, timeout=10).json()["how"]


def _wait_published(r: RedisServer, workers, timeout: float = 20.0) -> None:
    c = r.client()
    until = time.time() + timeout
    while time.time() < until:
        try:
            if all(c.get(f"{{mimo:rt}}:hb:{w.url}") for w in workers):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("workers did not publish heartbeats")


def test_redis_killed_mid_request_in_a_pd_deployment(model):
    ref = ServerProcess(*pd_flags(model))
    try:
        want = [_ask(ref.url, model, p, False) for p in PROMPTS]
    finally:
        ref.stop()
    r = RedisServer()
    procs: list = []
    try:
        pd = ["--router-redis", r.url]
        procs += [WorkerProcess(pd_flags(model, "--role", "prefill", *pd))]
        procs += [WorkerProcess(pd_flags(model, "--role", "decode", *pd)) for _ in range(2)]
        pre, d1, d2 = procs
        _wait_published(r, procs)
        rt = RouterProcess(["--model", model, "--health-interval", "0.3", "--redis", r.url,
                            "--redis-timeout", "0.2", "--prefill", pre.url,
                            "--decode", d1.url, "--decode", d2.url])
        procs.append(rt)
        assert _ask(rt.url, model, PROMPTS[0], True) == want[0]
        assert _how(rt.url, model, PROMPTS[0]) == "pd/score"
        # Four requests (two streamed) in flight when Redis dies.
        got: dict[int, str] = {}
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                got[i] = _ask(rt.url, model, PROMPTS[i], stream=i % 2 == 0)
            except BaseException as e:  # noqa: BLE001 - asserted below
                errors.append(e)
        th = [threading.Thread(target=one, args=(i,)) for i in range(1, 5)]
        for t in th:
            t.start()
        time.sleep(0.3)
        r.kill()
        assert sum(t.is_alive() for t in th) >= 2, "Redis died after the requests ended"
        for t in th:
            t.join(300)
        assert not errors, errors
        assert got == {i: want[i] for i in range(1, 5)}
        # While Redis is away: paired decisions by local hashing, the same answers.
        assert _how(rt.url, model, PROMPTS[5]) == "pd/fallback"
        assert rt.counters()["mimo_router_redis_errors_total"]
        for stream in (False, True):
            assert _ask(rt.url, model, PROMPTS[5], stream) == want[5]
        # Redis back: the workers republish, the router scores again.
        r.restart()
        _wait_published(r, procs[:3])
        until = time.time() + 20
        while _how(rt.url, model, PROMPTS[0]) != "pd/score" and time.time() < until:
            time.sleep(0.2)
        assert _how(rt.url, model, PROMPTS[0]) == "pd/score"
        assert _ask(rt.url, model, PROMPTS[0], True) == want[0]
        for w in (pre, d1, d2):
            PoolsAt(w.url).assert_pools_idle(timeout=10)
    finally:
        for p in reversed(procs):
            p.stop()
        r.stop()
