"""Tools through the official openai client against the real server (the default model):
forced ('required') and named tool_choice always return a call whose arguments validate
against the tool's schema (jsonschema), greedy and sampled; streamed deltas assemble into
exactly the non-streamed call; the legacy functions / function_call; a multi-turn exchange
with role "tool" results, rendered through the chat template."""
from __future__ import annotations

import json

import jsonschema
import pytest

MODEL = "gemma-3-270m"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 32},
    "limit": {"type": "integer", "minimum": 1, "maximum": 5},
    "tags": {"type": "array", "items": {"enum": ["news", "papers", "code"]}, "maxItems": 2}},
    "required": ["query"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "description": "Web search",
                                           "parameters": SEARCH}}]
SCHEMA = {"get_weather": WEATHER, "search": SEARCH}
ASK = [{"role": "user", "content": "What is the weather in Paris for three days?"}]


def check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMA[call.function.name])
    return args


@pytest.mark.parametrize("choice", ["required", "get_weather", "search"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_tool_choice_always_calls_with_valid_arguments(client, choice, temperature):
    tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    for seed in range(3 if temperature else 1):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice=tc, max_tokens=120,
                                           temperature=temperature, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert len(ch.message.tool_calls) == 1
        call = ch.message.tool_calls[0]
        if choice != "required":
            assert call.function.name == choice
        check_call(call)


@pytest.mark.parametrize("choice", ["required", "search"])
def test_streamed_deltas_assemble_into_the_whole_call(client, choice):
    tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tc, max_tokens=120,
              temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                c["id"] = c["id"] or d.id
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_legacy_functions_and_function_call(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK,
                                       functions=[t["function"] for t in TOOLS],
                                       function_call={"name": "get_weather"}, max_tokens=120,
                                       temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "function_call"
    assert ch.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(ch.message.function_call.arguments), WEATHER)


def raw_continuation(server, messages, max_tokens: int, **tool_fields) -> tuple[str, str]:
    """The reference of a chat answer: its prompt as /tokenize renders it, continued by a
    plain completion (no parser): (text, finish_reason)."""
    import httpx
    from helpers.api_server import KEY_HEADER
    ids = httpx.post(server.url + "/tokenize", headers=KEY_HEADER, timeout=60,
                     json={"messages": messages, **tool_fields}).json()["tokens"]
    r = httpx.post(server.url + "/v1/completions", headers=KEY_HEADER, timeout=120, json={
        "model": MODEL, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}).json()
    return r["choices"][0]["text"], r["choices"][0]["finish_reason"]


@pytest.mark.parametrize("choice", ["none", "auto"])
def test_tool_choice_none_and_auto_answer_with_text(client, server, choice):
    """Greedy, 8 tokens: the model writes no call here, so the answer is exactly the plain
    continuation of the prompt generation renders (tools shown under auto only)."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice=choice, max_tokens=8, temperature=0)
    text, finish = raw_continuation(server, ASK, 8, tools=TOOLS, tool_choice=choice)
    assert "<tool_call>" not in text and "```tool_code" not in text     # the premise
    ch = r.choices[0]
    assert ch.message.tool_calls is None
    assert ch.message.content == text and ch.finish_reason == finish
    assert r.usage.completion_tokens == 8 if finish == "length" else r.usage.completion_tokens < 8


def test_multi_turn_with_tool_results(client, server):
    import httpx
    from helpers.api_server import KEY_HEADER
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice="required", max_tokens=120, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                       max_tokens=16, temperature=0)
    text, finish = raw_continuation(server, history, 16, tools=TOOLS)
    if r.choices[0].message.tool_calls:        # the model called again: the text held it
        assert r.choices[0].finish_reason == "tool_calls" and "<tool_call>" in text
    else:
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (text, finish)
    assert r.usage.prompt_tokens > first.usage.prompt_tokens
    # what the model saw: its call and the result, in the template's turns
    ids = httpx.post(server.url + "/tokenize", headers=KEY_HEADER,
                     json={"messages": history}).json()["tokens"]
    text = httpx.post(server.url + "/detokenize", headers=KEY_HEADER,
                      json={"tokens": ids}).json()["prompt"]
    assert call.function.arguments in text
    assert '{"temperature": 21, "sky": "clear"}' in text
    # user, model (the call), user (the result), then the generation prompt's model turn
    assert text.count("<start_of_turn>user") == 2 and text.count("<start_of_turn>model") == 2
    # a second forced call on top of the history works too
    again = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                           tool_choice={"type": "function",
                                                        "function": {"name": "search"}},
                                           max_tokens=120, temperature=0)
    check_call(again.choices[0].message.tool_calls[0])


def test_json_response_formats(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                               "age": {"type": "integer", "minimum": 0,
                                                       "maximum": 120}},
              "required": ["name", "age"]}
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A person as JSON"}], max_tokens=80,
        temperature=0, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Any JSON object"}],
        max_tokens=JSON_OBJECT_TOKENS, temperature=0, response_format={"type": "json_object"},
        stop=None)
    text = r.choices[0].message.content
    # Room enough for the whole object: it always ends, and always parses.
    assert r.choices[0].finish_reason == "stop", r.usage
    assert isinstance(json.loads(text), dict)
    # tool_choice none beside tools: the JSON answer is allowed (no call is possible anyway)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Any JSON object"}], tools=TOOLS,
        tool_choice="none", max_tokens=JSON_OBJECT_TOKENS, temperature=0,
        response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert isinstance(json.loads(r.choices[0].message.content), dict)


JSON_OBJECT_TOKENS = 120      # greedy closes its object after about 20


def test_tokenize_renders_forced_tool_choices_as_generation(client, server):
    """/tokenize with tool_choice required or named (a 500 once): the prompt generation
    renders, whose length the forced generation reports."""
    import httpx
    from helpers.api_server import KEY_HEADER

    def tokenize(**kw):
        r = httpx.post(server.url + "/tokenize", headers=KEY_HEADER, timeout=60,
                       json={"messages": ASK, "tools": TOOLS, **kw})
        assert r.status_code == 200, r.text
        return r.json()
    auto = tokenize()
    for tc in ("required", {"type": "function", "function": {"name": "search"}}):
        assert tokenize(tool_choice=tc)["tokens"] == auto["tokens"]
    g = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice="required", max_tokens=120, temperature=0)
    assert g.usage.prompt_tokens == auto["count"]
    assert tokenize(tool_choice="none")["count"] < auto["count"]    # no tool list


def test_parse_without_the_tool_format_is_a_typed_error():
    from mimo.api import schemas
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    with pytest.raises(TypeError, match="tool_format"):
        schemas.parse("chat", body, 1024)


def test_a_forced_tool_is_closed_unless_its_schema_opens_it(client):
    """A forced call's arguments are closed to the listed properties where the schema leaves
    `additionalProperties` unsaid, strict or not (XGrammar's default: {"type": "object"}
    then admits only {}); `additionalProperties: true` opens them, and sampled calls use
    that freedom."""
    def args(strict: bool, opened: bool, seed: int) -> dict:
        params = {"type": "object", **({"additionalProperties": True} if opened else {})}
        tool = {"type": "function", "function": {"name": "note", "parameters": params,
                                                 "strict": strict}}
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write a note about Paris"}],
            tools=[tool], tool_choice="required", max_tokens=80, temperature=1.0, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        return json.loads(r.choices[0].message.tool_calls[0].function.arguments)
    assert all(args(strict, False, seed) == {} for strict in (True, False) for seed in range(2))
    assert any(args(False, True, seed) != {} for seed in range(3))


@pytest.mark.parametrize("choice", ["required", "search"])
def test_forced_calls_under_speculative_decoding(client, spec_client, choice):
    """n-gram drafts checked against the grammar: the same call as without speculation
    (greedy is lossless), its arguments intact, streamed too."""
    tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tc, max_tokens=120,
              temperature=0)
    want = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    got = spec_client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert (got.function.name, got.function.arguments) == \
        (want.function.name, want.function.arguments)
    check_call(got)
    args = "".join(d.function.arguments or "" for c in spec_client.chat.completions.create(
        **kw, stream=True) for ch in c.choices for d in ch.delta.tool_calls or [])
    assert args == want.function.arguments
