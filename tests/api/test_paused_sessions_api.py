"""An answer that ends in a tool call pauses its session: the server holds what it cached
(`mimo_prefix_cache_paused_sessions_total` counts the holds), through chat completions
whole and streamed and through /v1/responses; an answer without a call holds nothing.
(What a hold does to eviction: tests/kvcache/test_paused_sessions.py.)"""
from __future__ import annotations

import time

import httpx
from helpers.api_server import KEY_HEADER

MODEL = "gemma-3-270m"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
          "required": ["city"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                "parameters": PARAMS}}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": PARAMS}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAME = "mimo_prefix_cache_paused_sessions_total"


def holds(server) -> float:
    for line in httpx.get(server.url + "/metrics", headers=KEY_HEADER).text.splitlines():
        if line.startswith(NAME + " "):
            return float(line.split()[1])
    raise AssertionError(f"{NAME} not in /metrics")


def wait_for(server, want: float) -> float:
    """The hold reaches the engine thread through its inbox: poll briefly."""
    deadline = time.time() + 10
    got = holds(server)
    while got < want and time.time() < deadline:
        time.sleep(0.05)
        got = holds(server)
    return got


def test_tool_call_answers_hold_their_session_and_plain_answers_do_not(client, server):
    before = holds(server)
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=CHAT_TOOLS,
                                       tool_choice="required", max_tokens=60, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert wait_for(server, before + 1) == before + 1
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, tools=CHAT_TOOLS,
                                                tool_choice="required", max_tokens=60,
                                                temperature=0, stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    assert wait_for(server, before + 2) == before + 2
    resp = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                   tools=TOOLS, tool_choice="required", max_output_tokens=60,
                                   temperature=0)
    assert resp.output[-1].type == "function_call"
    assert wait_for(server, before + 3) == before + 3
    plain = client.chat.completions.create(model=MODEL, messages=ASK, tools=CHAT_TOOLS,
                                           tool_choice="none", max_tokens=4, temperature=0)
    assert plain.choices[0].finish_reason != "tool_calls"
    time.sleep(0.3)
    assert holds(server) == before + 3
    server.assert_pools_idle()
