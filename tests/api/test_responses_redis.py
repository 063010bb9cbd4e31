"""The Responses store shared through Redis: two real server processes on one real
redis-server; a chain of 10 previous_response_id turns starts on the first, which is then
killed (SIGKILL), and continues on the second, which also retrieves the first's responses.
Each turn's input_tokens is /tokenize's count of the conversation written out here, so the
second server rebuilt exactly the chain the first stored. With Redis then killed, the
store's absence is a 503, not a miss."""
from __future__ import annotations

import signal

import httpx
import pytest
from helpers.api_server import ServerProcess
from helpers.redis_servers import RedisServer

MODEL = "gemma-3-270m"


@pytest.fixture(scope="module")
def redis_server():
    r = RedisServer()
    yield r
    r.stop()


def _serve(redis_url: str, *extra: str) -> ServerProcess:
    return ServerProcess("--dtype", "float32", "--kv-cache-memory", "128MiB",
                         "--responses-store", redis_url, "--responses-ttl", "600", *extra)


def _client(s: ServerProcess):
    from openai import OpenAI
    return OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _count(s: ServerProcess, messages: list[dict]) -> int:
    r = httpx.post(s.url + "/tokenize", json={"messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_chain_continues_on_a_second_replica_after_the_first_is_killed(redis_server):
    a = _serve(redis_server.url)
    try:
        b = _serve(redis_server.url)
    except BaseException:
        a.stop()
        raise
    try:
        msgs: list[dict] = []
        ids, prev = [], None
        for k in range(10):
            s = a if k < 5 else b
            if k == 5:
                a.proc.send_signal(signal.SIGKILL)
                a.proc.wait(10)
            ask = f"Turn {k}: name an animal."
            r = _client(s).responses.create(model=MODEL, input=ask, previous_response_id=prev,
                                            max_output_tokens=5, temperature=0)
            msgs.append({"role": "user", "content": ask})
            assert r.usage.input_tokens == _count(b, msgs), k
            msgs.append({"role": "assistant", "content": r.output_text})
            ids.append(r.id)
            prev = r.id
        for rid in ids[:5]:     # the dead replica's responses, from the live one
            assert _client(b).responses.retrieve(rid).id == rid
        keys = redis_server.client().keys("mimo:responses:*")
        assert len(keys) == 10
        assert all(0 < redis_server.client().ttl(k) <= 600 for k in keys)
        # Redis down: a chained create and a retrieve are 503 (store_unavailable), never a
        # 400/404 telling the client its response is gone; the server stays up.
        redis_server.kill()
        c = _client(b)
        for call in (lambda: c.responses.retrieve(ids[-1]),
                     lambda: c.responses.create(model=MODEL, input="Hi", max_output_tokens=2,
                                                previous_response_id=ids[-1])):
            with pytest.raises(Exception) as e:
                call()
            assert e.value.status_code == 503 and "store_unavailable" in str(e.value.body)
        assert httpx.get(b.url + "/health", timeout=10).status_code == 200
    finally:
        a.stop()
        b.stop()
