"""/v1/responses against the real server (the default model), through the official openai
client: create (whole and streamed), retrieve, delete, input_items, previous_response_id
chains, instructions, function tools and function_call_output, text.format json_schema,
store: false. Every body and stream event validates against the openai package's own types.

References independent of the code under test: a greedy Response equals chat completions'
answer to the same messages written out by hand here, and each chained turn's input_tokens
is /tokenize's count of those hand-written messages (so the chain rebuilt from the store is
exactly the conversation)."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from helpers.api_server import API_KEY

MODEL = "gemma-3-270m"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                "parameters": WEATHER, "strict": True}}]


def validate_response(body: dict) -> None:
    from openai.types.responses import Response
    Response.model_validate(body)


def raw_events(server, body: dict) -> list[dict]:
    """The SSE events of a streamed create, as sent (event: name, data: JSON)."""
    out = []
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True},
                      headers=AUTH, timeout=120) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                e = json.loads(line[6:])
                assert e["type"] == name
                out.append(e)
    return out


def tokens(server, messages, tools=None) -> int:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    r = httpx.post(server.url + "/tokenize", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_create_retrieve_delete(client, server):
    r = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    validate_response(r.model_dump(mode="json"))
    # Greedy: exactly chat completions' answer to the same message.
    chat = client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert (r.status == "incomplete") == (chat.choices[0].finish_reason == "length")
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == \
        [("message", "user", "Say hello.")]
    client.responses.delete(r.id)
    for call in (lambda: client.responses.retrieve(r.id),
                 lambda: client.responses.delete(r.id)):
        with pytest.raises(Exception) as e:
            call()
        assert getattr(e.value, "status_code", None) == 404


def test_instructions_and_chain_of_ten_turns(client, server):
    """Each turn continues the stored chain; `instructions` apply to their own turn only."""
    msgs: list[dict] = []
    prev = None
    for k in range(10):
        ask = f"Turn {k}: name a fruit."
        instr = "Answer in one word." if k % 3 == 0 else None
        r = client.responses.create(model=MODEL, input=ask, previous_response_id=prev,
                                    instructions=instr, max_output_tokens=6, temperature=0)
        msgs.append({"role": "user", "content": ask})
        want = ([{"role": "system", "content": instr}] if instr else []) + msgs
        assert r.usage.input_tokens == tokens(server, want), k
        chat = client.chat.completions.create(model=MODEL, messages=want, max_tokens=6,
                                              temperature=0)
        assert r.output_text == chat.choices[0].message.content, k
        # From turn 2 on, an earlier turn without instructions began the same conversation
        # (turn 1's prompt shares only the template's first tokens with turn 0's).
        if k >= 2 and not instr:
            assert r.usage.input_tokens_details.cached_tokens > 0, k
        assert r.previous_response_id == prev and r.instructions == instr
        msgs.append({"role": "assistant", "content": r.output_text})
        prev = r.id


def test_stream_events_follow_openai_shapes(client, server):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter
    ta = TypeAdapter(ResponseStreamEvent)
    body = {"model": MODEL, "input": "Count to three.", "max_output_tokens": 10,
            "temperature": 0}
    events = raw_events(server, body)
    for e in events:
        ta.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", types[-1]]
    final = events[-1]["response"]
    assert types[-1] == ("response.incomplete" if final["status"] == "incomplete"
                         else "response.completed")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final["output"][0]["content"][0]["text"]
    whole = client.responses.create(**body)
    assert whole.output_text == text
    assert client.responses.retrieve(final["id"]).output_text == text


def test_official_client_streams_a_forced_call(client):
    """responses.stream (the SDK's accumulator) and create(stream=True) against the whole
    answer: the same function_call, arguments valid against the schema."""
    kw = dict(model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
              tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
              temperature=0)
    whole = client.responses.create(**kw)
    assert whole.status == "completed" and [o.type for o in whole.output] == ["function_call"]
    call = whole.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with client.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == call.arguments
    assert [(o.name, o.arguments) for o in final.output] == [(call.name, call.arguments)]
    done = [e for e in client.responses.create(**kw, stream=True)
            if e.type == "response.completed"]
    assert done[0].response.output[0].arguments == call.arguments


def test_function_call_output_turn(client, server):
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                tools=TOOLS, tool_choice="required", max_output_tokens=60,
                                temperature=0)
    call = r.output[0]
    result = json.dumps({"temperature": 21})
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, tools=TOOLS,
                                 input=[{"type": "function_call_output",
                                         "call_id": call.call_id, "output": result}],
                                 max_output_tokens=8, temperature=0)
    want = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": result}]
    assert r2.usage.input_tokens == tokens(server, want, CHAT_TOOLS)
    chat = client.chat.completions.create(model=MODEL, messages=want, tools=CHAT_TOOLS,
                                          max_tokens=8, temperature=0)
    assert r2.output_text == (chat.choices[0].message.content or "")
    items = client.responses.input_items.list(r2.id)
    assert [(i.type, i.call_id, i.output) for i in items.data] == \
        [("function_call_output", call.call_id, result)]


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Pick a color.", max_output_tokens=30,
                                temperature=0.9, text={"format": {
                                    "type": "json_schema", "name": "pick", "schema": schema}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_logprobs_as_chat_gives_them(client, server):
    """include message.output_text.logprobs + top_logprobs: the part's logprobs are chat
    completions' for the same greedy request; the streamed deltas' add up to them."""
    kw = dict(model=MODEL, input="Name a planet.", max_output_tokens=6, temperature=0)
    r = client.responses.create(**kw, include=["message.output_text.logprobs"],
                                top_logprobs=2)
    part = r.output[0].content[0]
    chat = client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Name a planet."}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2)
    want = [c.model_dump() for c in chat.choices[0].logprobs.content]
    got = [lp.model_dump() for lp in part.logprobs]
    assert got == want and len(got) == r.usage.output_tokens
    assert all(len(x["top_logprobs"]) == 2 for x in got)
    events = raw_events(server, {**kw, "include": ["message.output_text.logprobs"],
                                 "top_logprobs": 2})
    streamed = [x for e in events if e["type"] == "response.output_text.delta"
                for x in e["logprobs"]]
    assert streamed == want
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == want
    # Off unless asked.
    assert client.responses.create(**kw).output[0].content[0].logprobs == []


def test_store_false_is_not_kept(client):
    r = client.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=2)
    assert r.store is False
    with pytest.raises(Exception) as e:
        client.responses.retrieve(r.id)
    assert e.value.status_code == 404
    with pytest.raises(Exception) as e:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=r.id,
                                max_output_tokens=2)
    assert e.value.status_code == 400 and e.value.param == "previous_response_id"
    assert e.value.code == "previous_response_not_found"


def test_input_items_pages(client):
    inp = [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(5)]
    r = client.responses.create(model=MODEL, input=inp, max_output_tokens=1)
    desc = client.responses.input_items.list(r.id)
    assert [i.content[0].text for i in desc.data] == ["m4", "m3", "m2", "m1", "m0"]
    page = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["m0", "m1"] and page.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["m2", "m3", "m4"] and not rest.has_more


def _aborted(server) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('mimo_requests_total{endpoint="responses",status="499"}'))


@pytest.mark.parametrize("stream", [True, False])
def test_client_that_goes_away_frees_its_kv_and_stores_nothing(server, stream):
    import time
    before = _aborted(server)
    b = {"model": MODEL, "input": "Write a long story.", "max_output_tokens": 2000,
         "temperature": 0, "stream": stream}
    if stream:
        with httpx.stream("POST", server.url + "/v1/responses", json=b, headers=AUTH,
                          timeout=60) as r:
            for line in r.iter_lines():
                if '"response.output_text.delta"' in line:
                    break       # generation is running: leave
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/responses", json=b, headers=AUTH, timeout=3)
    deadline = time.time() + 30
    while _aborted(server) < before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _aborted(server) == before + 1
    server.assert_pools_idle(timeout=10)


def test_concurrent_chains_stay_apart(server, aclient):
    """Eight chains of three turns at once (streamed and not, alternately): each turn's
    prompt is its own chain's conversation, and the KV pools end idle."""
    import asyncio

    async def chain(c, i: int) -> list[tuple[int, list[dict]]]:
        msgs, prev, out = [], None, []
        for k in range(3):
            ask = f"Chain {i} turn {k}: a colour?"
            kw = dict(model=MODEL, input=ask, previous_response_id=prev,
                      max_output_tokens=4, temperature=0)
            if (i + k) % 2:
                r = None
                async for e in await c.responses.create(**kw, stream=True):
                    if e.type in ("response.completed", "response.incomplete"):
                        r = e.response
            else:
                r = await c.responses.create(**kw)
            msgs.append({"role": "user", "content": ask})
            out.append((r.usage.input_tokens, list(msgs)))
            msgs.append({"role": "assistant", "content": r.output_text})
            prev = r.id
        return out

    async def main():
        c = aclient()
        return await asyncio.gather(*(chain(c, i) for i in range(8)))
    for turns in asyncio.run(main()):
        for count, msgs in turns:
            assert count == tokens(server, msgs)
    server.assert_pools_idle()
