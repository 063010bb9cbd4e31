"""cache_salt and prompt_cache_key through the real server (chat completions, completions and
/v1/responses): bad values are a 400 naming the field; a prompt cached under one salt gives 0
cached tokens to the same prompt under another salt or none, and hits under its own; the
prompt_cache_key sessions show in /metrics without a label per key."""
from __future__ import annotations

import uuid

import httpx
import pytest
from helpers.api_server import API_KEY, KEY_HEADER
from prometheus_client.parser import text_string_to_metric_families

MODEL = "gemma-3-270m"
BAD = [("cache_salt", 5), ("cache_salt", ""), ("cache_salt", "s" * 257), ("cache_salt", ["s"]),
       ("prompt_cache_key", 1.5), ("prompt_cache_key", ""), ("prompt_cache_key", "k" * 257)]


def _body(kind: str, text: str, **kw) -> dict:
    if kind == "chat":
        return {"model": MODEL, "messages": [{"role": "user", "content": text}],
                "max_tokens": 2, "temperature": 0, **kw}
    if kind == "completion":
        return {"model": MODEL, "prompt": text, "max_tokens": 2, "temperature": 0, **kw}
    return {"model": MODEL, "input": text, "max_output_tokens": 2, "temperature": 0, **kw}


PATH = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
        "responses": "/v1/responses"}


def _post(server, kind, body):
    return httpx.post(server.url + PATH[kind], json=body, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"})


def _cached(kind, r) -> int:
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    d = u["input_tokens_details"] if kind == "responses" else u["prompt_tokens_details"]
    return d["cached_tokens"]


@pytest.mark.parametrize("kind", ["chat", "completion", "responses"])
@pytest.mark.parametrize("field,value", BAD)
def test_bad_scope_values_are_400(server, kind, field, value):
    r = _post(server, kind, _body(kind, "Hi", **{field: value}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert r.json()["error"]["type"] == "invalid_request_error"


def _long_text() -> str:
    # A prompt no other test sends: its own words, long enough for many pages.
    words = uuid.uuid4().hex
    return " ".join(f"{words[i % 32]}{i}" for i in range(300))


@pytest.mark.parametrize("kind", ["chat", "completion", "responses"])
def test_reads_across_salts_miss_and_same_salt_hits(server, kind):
    text = _long_text()
    # Each hit follows its write closely: the shared server's SWA pool holds a few windows
    # of this length, and every salt's copy takes its own.
    got = [_cached(kind, _post(server, kind, _body(kind, text, **({"cache_salt": s} if s else {}))))
           for s in ("alice", "bob", "alice", None, None)]
    assert got[:2] == [0, 0] and got[3] == 0, got      # other salts, and none, miss
    assert got[2] > 1000 and got[4] > 1000, got       # the same salt (or none again) hits
    server.assert_pools_idle()


def _metrics(server) -> dict:
    text = httpx.get(server.url + "/metrics", headers=KEY_HEADER, timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("mimo_prompt_cache_key")}


def test_prompt_cache_key_sessions_in_metrics(server):
    before = _metrics(server)
    keys = [f"session-{uuid.uuid4().hex}" for _ in range(3)]
    text = _long_text()
    cached = 0
    for k in keys + keys[:1]:
        r = _post(server, "chat", _body("chat", text, prompt_cache_key=k))
        cached += _cached("chat", r)
    r = _post(server, "responses", _body("responses", "Hi", prompt_cache_key=keys[0]))
    assert r.status_code == 200 and r.json()["prompt_cache_key"] == keys[0]
    after = _metrics(server)
    assert after["mimo_prompt_cache_keys_active"] - before["mimo_prompt_cache_keys_active"] == 3
    assert after["mimo_prompt_cache_key_requests_total"] \
        - before["mimo_prompt_cache_key_requests_total"] == 5
    assert after["mimo_prompt_cache_key_cached_tokens_total"] \
        - before["mimo_prompt_cache_key_cached_tokens_total"] == cached > 0
    text = httpx.get(server.url + "/metrics", headers=KEY_HEADER, timeout=10).text
    assert all(k not in text for k in keys)       # no series per key
