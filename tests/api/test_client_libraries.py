"""The agent-harness client libraries against the real server: langchain-openai's
`bind_tools` (forced and named tool_choice, streamed, a ToolMessage turn) and litellm's
OpenAI-compatible provider. Every call's arguments validate against the tool's schema."""
from __future__ import annotations

import json
import os

import jsonschema
import pytest
from helpers.api_server import API_KEY
from test_tools_api import ASK, SCHEMA, TOOLS, WEATHER

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # no cost-map download
os.environ.setdefault("LITELLM_TELEMETRY", "False")
MODEL = "gemma-3-270m"


@pytest.fixture(scope="module")
def chat_model(server):
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key=API_KEY,
                      temperature=0, max_tokens=120, max_retries=0, timeout=120)


@pytest.mark.parametrize("choice", ["any", "get_weather", "search"])
def test_langchain_bind_tools(chat_model, choice):
    llm = chat_model.bind_tools(TOOLS, tool_choice=choice)
    msg = llm.invoke("What is the weather in Paris for three days?")
    assert len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    if choice != "any":
        assert call["name"] == choice
    jsonschema.validate(call["args"], SCHEMA[call["name"]])
    # streamed: the chunks add up to the same call
    total = None
    for chunk in llm.stream("What is the weather in Paris for three days?"):
        total = chunk if total is None else total + chunk
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [(call["name"], call["args"])]


def test_langchain_tool_message_turn(chat_model):
    from langchain_core.messages import HumanMessage, ToolMessage
    llm = chat_model.bind_tools(TOOLS, tool_choice="get_weather")
    history = [HumanMessage("What is the weather in Paris for three days?")]
    ai = llm.invoke(history)
    call = ai.tool_calls[0]
    history += [ai, ToolMessage(json.dumps({"temperature": 21}), tool_call_id=call["id"])]
    reply = chat_model.bind_tools(TOOLS).invoke(history)
    assert reply.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")


def test_litellm_tools(server):
    import litellm
    kw = dict(model="openai/" + MODEL, api_base=server.url + "/v1", api_key=API_KEY,
              messages=ASK, tools=TOOLS, max_tokens=120, temperature=0)
    r = litellm.completion(**kw, tool_choice={"type": "function",
                                              "function": {"name": "get_weather"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = litellm.completion(**kw, tool_choice="required")
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA[call.function.name])
    parts = list(litellm.completion(**kw, tool_choice="required", stream=True))
    args = "".join(tc.function.arguments or "" for p in parts for tc in
                   (p.choices[0].delta.tool_calls or []))
    assert json.loads(args) == json.loads(call.function.arguments)
