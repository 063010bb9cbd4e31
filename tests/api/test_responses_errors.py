"""Hostile and unsupported /v1/responses requests against the real server: each gets its
exact 4xx status and an OpenAI-shaped error naming the field (never a 5xx, never a 200 that
drops what it was sent), streamed or not; the server stays healthy with its KV pools idle."""
from __future__ import annotations

import httpx
import pytest
from helpers.api_server import API_KEY

MODEL = "gemma-3-270m"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
URL = "/v1/responses"
FC = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def body(**kw) -> dict:
    return {"model": MODEL, "input": "Hi", "max_output_tokens": 2, **kw}


# (name, body, status, param)
CASES = [
    ("not an object", [1, 2], 400, None),
    ("no model", {"input": "Hi"}, 400, "model"),
    ("other model", body(model="gpt-x"), 404, "model"),
    ("no input", {"model": MODEL}, 400, "input"),
    ("empty input", body(input=[]), 400, "input"),
    ("empty string input", body(input=""), 400, "input"),
    ("number input", body(input=5), 400, "input"),
    ("item not an object", body(input=["hi"]), 400, "input"),
    ("unknown item type", body(input=[{"type": "computer_call", "id": "x"}]), 400, "input"),
    ("item_reference", body(input=[{"type": "item_reference", "id": "msg_1"}]), 400, "input"),
    ("no type, no role", body(input=[{"content": "hi"}]), 400, "input"),
    ("bad role", body(input=[{"role": "robot", "content": "hi"}]), 400, "input"),
    ("empty content", body(input=[{"role": "user", "content": []}]), 400, "input"),
    ("output_text from user", body(input=[{"role": "user", "content": [
        {"type": "output_text", "text": "x"}]}]), 400, "input"),
    ("input_file", body(input=[{"role": "user", "content": [
        {"type": "input_file", "file_id": "f"}]}]), 400, "input"),
    ("image on a text model", body(input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://127.0.0.1:9/a.png"}]}]), 400, "input"),
    ("text not a string", body(input=[{"role": "user", "content": [
        {"type": "input_text", "text": 3}]}]), 400, "input"),
    ("call arguments not JSON", body(input=[{**FC, "arguments": "{"}]), 400, "input"),
    ("call without name", body(input=[{**FC, "name": ""}]), 400, "input"),
    ("output without its call", body(input=[{"type": "function_call_output",
                                             "call_id": "nope", "output": "1"}]), 400, "input"),
    ("output an object", body(input=[FC, {"type": "function_call_output", "call_id": "c1",
                                          "output": {"a": 1}}]), 400, "input"),
    ("output without call_id", body(input=[FC, {"type": "function_call_output",
                                                "output": "1"}]), 400, "input"),
    ("encrypted reasoning", body(input=[{"type": "reasoning", "summary": [],
                                         "encrypted_content": "x"}]), 400, "input"),
    ("unknown previous_response_id", body(previous_response_id="resp_nope"), 400,
     "previous_response_id"),
    ("previous_response_id a number", body(previous_response_id=5), 400,
     "previous_response_id"),
    ("unknown field", body(frobnicate=1), 400, "frobnicate"),
    ("prompt_cache_key a number", body(prompt_cache_key=5), 400, "prompt_cache_key"),
    ("prompt_cache_key too long", body(prompt_cache_key="k" * 257), 400, "prompt_cache_key"),
    ("cache_salt empty", body(cache_salt=""), 400, "cache_salt"),
    ("cache_salt an object", body(cache_salt={"a": 1}), 400, "cache_salt"),
    ("cache_salt too long", body(cache_salt="s" * 257), 400, "cache_salt"),
    ("conversation", body(conversation="conv_1"), 400, "conversation"),
    ("background", body(background=True), 400, "background"),
    ("include", body(include=["reasoning.encrypted_content"]), 400, "include"),
    ("reasoning effort", body(reasoning={"effort": "high"}), 400, "reasoning"),
    ("truncation auto", body(truncation="auto"), 400, "truncation"),
    ("top_logprobs over 20", body(top_logprobs=21), 400, "top_logprobs"),
    ("include not a list", body(include="message.output_text.logprobs"), 400, "include"),
    ("logprobs with tools", body(include=["message.output_text.logprobs"],
                                 tools=[{"type": "function", "name": "f"}]), 400, "include"),
    ("web_search tool", body(tools=[{"type": "web_search"}]), 400, "tools"),
    ("tools not a list", body(tools={"type": "function"}), 400, "tools"),
    ("tool without name", body(tools=[{"type": "function", "parameters": {}}]), 400, "tools"),
    ("tool_choice a file_search", body(tool_choice={"type": "file_search"}), 400,
     "tool_choice"),
    ("tool_choice names no tool", body(tools=[{"type": "function", "name": "f"}],
                                       tool_choice={"type": "function", "name": "g"}), 400,
     "tool_choice"),
    ("required without tools", body(tool_choice="required"), 400, "tool_choice"),
    ("bad schema", body(text={"format": {"type": "json_schema", "name": "n",
                                         "schema": {"type": "bogus"}}}), 400, "text.format"),
    ("bad format type", body(text={"format": {"type": "yaml"}}), 400, "text"),
    ("max_output_tokens 0", body(max_output_tokens=0), 400, "max_output_tokens"),
    ("max_output_tokens huge", body(max_output_tokens=10**9), 400, "max_output_tokens"),
    ("temperature a string", body(temperature="hot"), 400, "temperature"),
    ("store a string", body(store="yes"), 400, "store"),
    ("instructions an array", body(instructions=[1]), 400, "instructions"),
    ("metadata not strings", body(metadata={"a": 1}), 400, "metadata"),
    ("input over the context", body(input="hello " * 40000), 400, "input"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_request(server, case, stream):
    _, b, status, param = case
    if stream and isinstance(b, dict):
        b = {**b, "stream": True}
    r = httpx.post(server.url + URL, json=b, headers=AUTH, timeout=60)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_oversized_body_is_413(server):
    big = b'{"model": "gemma-3-270m", "input": "' + b"a" * (8 * 2**20 + 1024) + b'"}'
    r = httpx.post(server.url + URL, content=big, headers={**AUTH, "Content-Type":
                                                           "application/json"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/responses/resp_nope", 404),
    ("DELETE", "/v1/responses/resp_nope", 404),
    ("GET", "/v1/responses/resp_nope/input_items", 404),
    ("PUT", "/v1/responses/resp_nope", 405),
    ("GET", "/v1/responses", 405),
])
def test_unknown_ids_and_methods(server, method, path, status):
    r = httpx.request(method, server.url + path, headers=AUTH, timeout=30)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_needs_the_api_key(server):
    r = httpx.post(server.url + URL, json=body(), timeout=30)
    assert r.status_code == 401
    r = httpx.get(server.url + URL + "/resp_x", timeout=30)
    assert r.status_code == 401


def test_bad_input_items_queries(server, client):
    rid = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1).id
    for q, param in (("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"),
                     ("after=msg_nope", "after"), ("colour=red", "colour")):
        r = httpx.get(f"{server.url}{URL}/{rid}/input_items?{q}", headers=AUTH, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (q, r.text)


def test_server_is_healthy_after_the_corpus(server):
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    server.assert_pools_idle()
