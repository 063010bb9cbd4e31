"""Reasoning items and function calls of a MiMo-V2-Flash-family model through /v1/responses:
the real server serving the rigged tiny checkpoint of tests/api/forced_mimo.py, whose greedy
output is one of two fixed texts in MiMo's format (picked by logit_bias, passed through as
chat takes it). The `<think>` block becomes reasoning items, each call a function_call item,
the rest a message; the streamed events (validated against the openai package's types)
assemble into exactly the whole Response; the next turn's prompt is chat's for the same
conversation (reasoning not rendered, as chat drops reasoning_content)."""
from __future__ import annotations

import json

import forced_mimo as fm
import httpx
import pytest
from helpers.api_server import ServerProcess
from test_reasoning_api import WANT

MODEL = "tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer", "minimum": 1}},
           "required": ["city"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}},
          "required": ["query"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": WEATHER},
         {"type": "function", "name": "search", "description": "Web search",
          "parameters": SEARCH}]
ASK = "What is the weather in Paris for three days?"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("forced_mimo_responses")
    fm.write(d)
    return d


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(model_dir):
    s = ServerProcess("--model", str(model_dir), "--served-model-name", MODEL, "--dtype",
                      "float32", "--kv-cache-memory", "32MiB")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _kw(tokenizer, text: str) -> dict:
    return dict(model=MODEL, input=ASK, tools=TOOLS, max_output_tokens=64, temperature=0,
                extra_body={"logit_bias": fm.ban_for(tokenizer, text)})


def _shape(output) -> list[tuple]:
    out = []
    for o in output:
        if o.type == "reasoning":
            out.append(("reasoning", "".join(c.text for c in o.content)))
        elif o.type == "message":
            out.append(("message", o.content[0].text))
        else:
            out.append((o.type, o.name, json.loads(o.arguments)))
    return out


@pytest.mark.parametrize("text", ["after", "inside"])
def test_reasoning_items_and_calls(client, tokenizer, text):
    from openai.types.responses import Response
    r = client.responses.create(**_kw(tokenizer, text))
    Response.model_validate(r.model_dump(mode="json"))
    reasoning, content, calls = WANT[text]
    shape = _shape(r.output)
    assert "".join(s[1] for s in shape if s[0] == "reasoning") == reasoning
    assert [s[1] for s in shape if s[0] == "message"] == ([content] if content else [])
    assert [(s[1], s[2]) for s in shape if s[0] == "function_call"] == calls
    if text == "after":
        assert [s[0] for s in shape] == ["reasoning", "function_call"]
    else:       # the call was written inside the thinking block: output in written order
        assert [s[0] for s in shape] == ["reasoning", "function_call", "reasoning", "message"]
    assert r.status == "completed"
    toks = fm.TEXTS[text]
    assert r.usage.output_tokens == len(toks)
    # Tokens from <think> through </think>, the markers included.
    assert r.usage.output_tokens_details.reasoning_tokens == toks.index(fm.END_THINK) + 1


@pytest.mark.parametrize("text", ["after", "inside"])
def test_streamed_events_assemble_into_the_response(client, tokenizer, text):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter
    ta = TypeAdapter(ResponseStreamEvent)
    whole = client.responses.create(**_kw(tokenizer, text))
    events = list(client.responses.create(**_kw(tokenizer, text), stream=True))
    for e in events:
        ta.validate_python(e.model_dump(mode="json", exclude_unset=True))
    final = events[-1]
    assert final.type == "response.completed"
    assert _shape(final.response.output) == _shape(whole.output)
    reasoning = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert len(reasoning) > 1 and "".join(reasoning) == WANT[text][0]
    assert not any("<" in d for d in reasoning)       # no partial tag leaks
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert _shape(done) == _shape(whole.output)


@pytest.mark.parametrize("text", ["after", "inside"])
def test_next_turn_prompt_is_chats(client, server, tokenizer, text):
    """The turn after a call: its prompt is chat's for the history chat itself answered
    (its message: content and tool_calls; reasoning not rendered), the call's id aside."""
    kw = _kw(tokenizer, text)
    r = client.responses.create(**kw)
    call = next(o for o in r.output if o.type == "function_call")
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, tools=TOOLS,
                                 max_output_tokens=4, temperature=0,
                                 input=[{"type": "function_call_output",
                                         "call_id": call.call_id, "output": "21 C"}])
    chat_tools = [{"type": "function", "function": {k: t[k] for k in
                                                    ("name", "description", "parameters")}}
                  for t in TOOLS]
    ans = client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                 "content": ASK}],
                                         tools=chat_tools, max_tokens=64, temperature=0,
                                         logit_bias=kw["extra_body"]["logit_bias"])
    m = ans.choices[0].message
    assert [c.function.name for c in m.tool_calls] == [call.name]
    msgs = [{"role": "user", "content": ASK},
            {"role": "assistant", "content": m.content, "tool_calls": [{
                "id": call.call_id, "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in m.tool_calls]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "21 C"}]
    tok = httpx.post(server.url + "/tokenize", json={"messages": msgs, "tools": chat_tools},
                     timeout=60).json()
    assert r2.usage.input_tokens == tok["count"]
    assert r2.usage.input_tokens_details.cached_tokens > 0
