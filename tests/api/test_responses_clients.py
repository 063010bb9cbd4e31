"""Agent-harness client libraries on /v1/responses against the real server (the default model):
langchain-openai's `ChatOpenAI(use_responses_api=True)` (invoke, stream, bind_tools, a
ToolMessage turn sent as the whole history and as a previous_response_id chain) and litellm's
`responses()` (tools, a function_call_output turn, streaming). Greedy answers must equal the
official client's for the same input, and the history sent whole must make the same prompt
as the same history continued through previous_response_id."""
from __future__ import annotations

import json
import os

import jsonschema
from helpers.api_server import API_KEY

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # no cost-map download
os.environ.setdefault("LITELLM_TELEMETRY", "False")
MODEL = "gemma-3-270m"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}}]
ASK = "What is the weather in Paris?"


def _llm(server, **kw):
    from langchain_openai import ChatOpenAI
    kw = {"temperature": 0, "max_tokens": 12, **kw}
    return ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key=API_KEY,
                      use_responses_api=True, max_retries=0, timeout=120, **kw)


def test_langchain_invoke_and_stream(server, client):
    want = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=12,
                                   temperature=0).output_text
    llm = _llm(server)
    msg = llm.invoke("Say hi.")
    assert msg.text == want and msg.response_metadata["id"].startswith("resp_")
    total = None
    for chunk in llm.stream("Say hi."):
        total = chunk if total is None else total + chunk
    assert total.text == want


def test_langchain_tool_turn_whole_history_and_chained(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    replies = {}
    for chained in (False, True):
        llm = _llm(server, max_tokens=60, use_previous_response_id=chained)
        history = [HumanMessage(ASK)]
        ai = llm.bind_tools(TOOLS, tool_choice="get_weather").invoke(history)
        assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather"
        jsonschema.validate(ai.tool_calls[0]["args"], WEATHER)
        history += [ai, ToolMessage(json.dumps({"temperature": 21}),
                                    tool_call_id=ai.tool_calls[0]["id"])]
        reply = _llm(server, max_tokens=8, use_previous_response_id=chained
                     ).bind_tools(TOOLS).invoke(history)
        replies[chained] = (reply.text, reply.usage_metadata["input_tokens"],
                            ai.tool_calls[0]["args"])
    assert replies[False] == replies[True]


def test_litellm_responses(server, client):
    import litellm
    kw = dict(model="openai/" + MODEL, api_base=server.url + "/v1", api_key=API_KEY,
              max_output_tokens=16, temperature=0)     # litellm raises lower ones to 16
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r = litellm.responses(**{**kw, "max_output_tokens": 60}, input=ASK, tools=tools,
                          tool_choice="required")
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    r2 = litellm.responses(**kw, previous_response_id=r.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    # (litellm hands out its own encoding of the id: the same turn sent as a whole history)
    want = client.responses.create(model=MODEL, tools=tools, max_output_tokens=16,
                                   temperature=0, input=[
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    assert r2.usage.input_tokens == want.usage.input_tokens
    assert r2.output[0].content[0].text == want.output_text
    events = list(litellm.responses(**kw, input="Say hi.", stream=True))
    types = [str(getattr(e.type, "value", e.type)) for e in events]
    assert types[0] == "response.created" and types[-1] in ("response.completed",
                                                            "response.incomplete")
    text = "".join(e.delta for e in events if str(getattr(e.type, "value", e.type)) ==
                   "response.output_text.delta")
    assert text == client.responses.create(model=MODEL, input="Say hi.",
                                           max_output_tokens=16, temperature=0).output_text
