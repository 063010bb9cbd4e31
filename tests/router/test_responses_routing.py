"""/v1/responses, cache_salt and prompt_cache_key through the real router in front of two
real workers (tiny Gemma 3, responses kept in each worker's own memory), with Redis for the
router's state: a chain of turns, streamed or not, stays on the worker that holds it even
where its prompt_cache_key would pin another, through either of two router replicas (the
makers are shared in Redis); stored responses are read, listed and deleted
through the router wherever they live; a salted prompt's published pages predict a hit only
under its own salt; requests with the same prompt_cache_key go to one worker. And without
workers: a session key's worker is left when it is overloaded."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis
from helpers.redis_servers import RedisServer

from mimo.router import cache_events as ce
from mimo.router import policy
from mimo.router.config import RouterConfig
from mimo.router.prompt import Prompt
from mimo.router.router import Router

from .conftest import (
    client,
    decide,
    decide_when,
    start_router,
    start_workers,
    stop_all,
    wait_published,
    whole_pages,
)


@pytest.fixture(scope="module")
def pair(tiny_dir):
    r = RedisServer()
    ws = rt = None
    try:
        ws = start_workers(tiny_dir, r.url, 2)
        wait_published(r.url, ws)
        rt = start_router(tiny_dir, r.url, ws)
        yield r, ws, rt
    finally:
        stop_all(rt, ws)
        r.stop()


def _create(rt, body: dict) -> tuple[dict, str]:
    if not body.get("stream"):
        r = httpx.post(rt.url + "/v1/responses", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json(), r.headers["x-mimo-worker"]
    with httpx.stream("POST", rt.url + "/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200
        worker = r.headers["x-mimo-worker"]
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    done = [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
    assert events[0]["type"] == "response.created" and len(done) == 1
    return done[0]["response"], worker


def _key_for(worker: str, urls: list[str]) -> str:
    """A prompt_cache_key whose affinity pins `worker`."""
    return next(k for k in (f"key-{i}" for i in range(1000))
                if policy.rendezvous(policy.affinity_key(k), urls)[0] == worker)


def test_a_chain_stays_with_its_maker_and_reads_pass_through(pair, tiny_dir):
    _, ws, rt = pair
    model, urls = str(tiny_dir), [w.url for w in ws]
    base = {"model": model, "max_output_tokens": 4, "temperature": 0}
    first, maker = _create(rt, {**base, "input": "Tell me about the sea."})
    other = next(u for u in urls if u != maker)
    key = _key_for(other, urls)       # its affinity says the other worker; the chain wins
    prev, ids = first["id"], [first["id"]]
    for turn, stream in enumerate((False, True, False)):
        resp, worker = _create(rt, {**base, "input": f"And turn {turn}?", "stream": stream,
                                    "previous_response_id": prev, "prompt_cache_key": key})
        assert worker == maker, (turn, stream)
        assert resp["previous_response_id"] == prev and resp["prompt_cache_key"] == key
        assert resp["usage"]["input_tokens_details"]["cached_tokens"] > 0
        prev = resp["id"]
        ids.append(prev)
    for rid in ids:         # the router knows their maker; another worker would say 404
        got = httpx.get(f"{rt.url}/v1/responses/{rid}", timeout=30)
        assert got.status_code == 200 and got.json()["id"] == rid
        assert got.headers["x-mimo-worker"] == maker
        items = httpx.get(f"{rt.url}/v1/responses/{rid}/input_items", timeout=30)
        assert items.status_code == 200 and items.json()["object"] == "list"
    assert httpx.delete(f"{rt.url}/v1/responses/{ids[0]}", timeout=30).status_code == 200
    gone = httpx.get(f"{rt.url}/v1/responses/{ids[0]}", timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    # One the router never relayed: every worker is asked, and each has it or says 404.
    direct = httpx.post(other + "/v1/responses", json={**base, "input": "Direct."},
                        timeout=120).json()
    got = httpx.get(f"{rt.url}/v1/responses/{direct['id']}", timeout=30)
    assert got.status_code == 200 and got.headers["x-mimo-worker"] == other
    assert httpx.get(f"{rt.url}/v1/responses/resp_nope", timeout=30).status_code == 404


def test_another_replica_knows_the_maker(pair, tiny_dir):
    r, ws, rt = pair
    model, urls = str(tiny_dir), [w.url for w in ws]
    base = {"model": model, "max_output_tokens": 4, "temperature": 0}
    first, maker = _create(rt, {**base, "input": "Tell me about rivers.", "stream": True})
    key = _key_for(next(u for u in urls if u != maker), urls)
    second = start_router(tiny_dir, r.url, ws)      # the same Redis, nothing relayed yet
    try:
        resp, worker = _create(second, {**base, "input": "More?", "prompt_cache_key": key,
                                        "previous_response_id": first["id"]})
        assert worker == maker
        got = httpx.get(f"{second.url}/v1/responses/{first['id']}", timeout=30)
        assert got.status_code == 200 and got.headers["x-mimo-worker"] == maker
        # ... and the first replica knows the maker of what the second relayed.
        _, again = _create(rt, {**base, "input": "Again?", "prompt_cache_key": key,
                                "previous_response_id": resp["id"]})
        assert again == maker
    finally:
        second.stop()


def test_a_first_turn_is_scored_by_its_prompt(pair, tiny_dir):
    # The router builds a first turn's prompt as the worker does: its published pages
    # predict exactly the cached tokens the worker reports for the same turn sent again.
    _, ws, rt = pair
    body = {"model": str(tiny_dir), "input": "A first turn about lakes. " * 10,
            "instructions": "Answer briefly.", "max_output_tokens": 2, "temperature": 0}
    _, worker = _create(rt, body)
    d = decide_when(rt, body, lambda d: d["predicted_cached_tokens"] > 0, kind="responses")
    assert d["worker"] == worker and d["how"] == "score"
    resp, again = _create(rt, body)
    assert again == worker
    assert whole_pages(resp["usage"]["input_tokens_details"]["cached_tokens"]) \
        == d["predicted_cached_tokens"]
    assert resp["usage"]["input_tokens"] == d["prompt_tokens"]


def test_prompt_cache_key_pins_a_worker(pair, tiny_dir):
    _, ws, rt = pair
    model, urls = str(tiny_dir), [w.url for w in ws]
    for target in urls:
        key = _key_for(target, urls)
        for i in range(3):      # unrelated prompts, one session key
            body = {"model": model, "messages": [{"role": "user", "content": f"q{i} {key}"}],
                    "max_tokens": 2, "prompt_cache_key": key}
            r = httpx.post(rt.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200 and r.headers["x-mimo-worker"] == target
            assert decide(rt, body)["how"] == "affinity"
        body = {"model": model, "input": f"hello {key}", "max_output_tokens": 2,
                "prompt_cache_key": key}
        assert _create(rt, body)[1] == target


def test_published_state_predicts_hits_only_under_the_same_salt(pair, tiny_dir):
    _, ws, rt = pair
    model = str(tiny_dir)
    msgs = [{"role": "user", "content": "a long salted prompt about rivers " * 12}]

    def body(**kw):
        return {"model": model, "messages": msgs, "max_tokens": 2, **kw}
    r = httpx.post(rt.url + "/v1/chat/completions", json=body(cache_salt="alice"), timeout=120)
    assert r.status_code == 200
    worker = r.headers["x-mimo-worker"]
    d = decide_when(rt, body(cache_salt="alice"), lambda d: d["predicted_cached_tokens"] > 0)
    assert d["worker"] == worker and d["predicted_cached_tokens"] > 50
    for other in (body(cache_salt="bob"), body()):
        assert decide(rt, other)["predicted_cached_tokens"] == 0
    again = httpx.post(rt.url + "/v1/chat/completions", json=body(cache_salt="alice"),
                       timeout=120)
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert again.headers["x-mimo-worker"] == worker and whole_pages(cached) == d["predicted_cached_tokens"]


def test_an_overloaded_session_worker_is_left(redis_server):
    A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
    r = redis.Redis.from_url(redis_server.url)
    for url, inc in ((A, "a"), (B, "b"), (C, "c")):
        hb = {"incarnation": inc, "fingerprint": bytes(8).hex(), "page_size": 16,
              "window": 0, "mode": "full", "uncached_tokens": 0}
        r.set(ce.heartbeat_key(url), json.dumps(hb), px=60_000)
    key = _key_for(A, [A, B, C])
    cfg = RouterConfig(workers=(A, B, C), redis=redis_server.url, model=None,
                       redis_timeout=30.0)   # a timed-out read would fall back

    async def go(busy: int):
        r.hset(ce.inflight_key("elsewhere"), A, busy)
        r.zadd(ce.ROUTERS, {"elsewhere": int(time.time() * 1000) + 60_000})   # never stale
        rt = Router(cfg)
        try:
            return [(await rt.decide_prompt(Prompt(list(range(i, i + 40))), session=key))
                    for i in range(3)]
        finally:
            await rt.stop()
    idle = asyncio.run(go(0))
    assert [(d.url, d.how) for d in idle] == [(A, "affinity")] * 3
    busy = asyncio.run(go(10))      # 10 in flight on A, none elsewhere: over 1.25 x mean + 1
    assert all(d.url != A and d.how == "score" for d in busy)


def test_the_official_client_through_the_router(pair, tiny_dir):
    """openai's responses.create (whole and streamed: the same greedy answer), retrieve,
    input_items and a previous_response_id chain through the router: the chain stays on
    its maker, reuses its KV there, and every response is found through the router."""
    _, ws, rt = pair
    c, model = client(rt), str(tiny_dir)
    kw = dict(model=model, max_output_tokens=6, temperature=0)
    raw = c.responses.with_raw_response.create(input="Tell me about hills.", **kw)
    first, maker = raw.parse(), raw.headers["x-mimo-worker"]
    assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
    events = list(c.responses.create(input="Tell me about hills.", stream=True, **kw))
    assert events[0].type == "response.created"
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1 and done[0].response.output_text == first.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        first.output_text
    prev = first.id
    for turn in range(3):
        raw = c.responses.with_raw_response.create(input=f"Go on ({turn}).",
                                                   previous_response_id=prev, **kw)
        resp = raw.parse()
        assert raw.headers["x-mimo-worker"] == maker and resp.previous_response_id == prev
        assert resp.usage.input_tokens_details.cached_tokens > 0
        got = c.responses.retrieve(resp.id)
        assert got.id == resp.id and got.output_text == resp.output_text
        prev = resp.id
    items = c.responses.input_items.list(prev, order="asc", limit=100).data
    assert any(it.type == "message" and "Go on (2)." in str(it.content) for it in items)


def test_langchain_and_litellm_responses_through_the_router(pair, tiny_dir):
    """langchain-openai (invoke, stream, a previous_response_id chain against the same
    history sent whole) and litellm (responses, streamed, chained) through the router give
    the official client's greedy answer."""
    import os
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # no cost-map download
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import litellm
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    _, _, rt = pair
    c, model = client(rt), str(tiny_dir)
    want = c.responses.create(model=model, input="Say hi.", max_output_tokens=16,
                              temperature=0).output_text
    llm = ChatOpenAI(model=model, base_url=rt.url + "/v1", api_key="none", temperature=0,
                     max_tokens=16, use_responses_api=True, max_retries=0, timeout=120)
    msg = llm.invoke("Say hi.")
    assert msg.text == want and msg.response_metadata["id"].startswith("resp_")
    total = None
    for chunk in llm.stream("Say hi."):
        total = chunk if total is None else total + chunk
    assert total.text == want
    chained = ChatOpenAI(model=model, base_url=rt.url + "/v1", api_key="none", temperature=0,
                         max_tokens=16, use_responses_api=True, use_previous_response_id=True,
                         max_retries=0, timeout=120)
    history = [HumanMessage("Say hi.")]
    history += [chained.invoke(history), HumanMessage("Again.")]
    whole = llm.invoke(history)
    assert chained.invoke(history).text == whole.text
    kw = dict(model="openai/" + model, api_base=rt.url + "/v1", api_key="none",
              max_output_tokens=16, temperature=0)
    r = litellm.responses(**kw, input="Say hi.")
    assert r.output[0].content[0].text == want
    events = list(litellm.responses(**kw, input="Say hi.", stream=True))
    text = "".join(e.delta for e in events if str(getattr(e.type, "value", e.type)) ==
                   "response.output_text.delta")
    assert text == want
    r2 = litellm.responses(**kw, previous_response_id=r.id, input="Again.")
    assert r2.usage.input_tokens > r.usage.input_tokens
