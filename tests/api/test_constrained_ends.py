"""Constrained outputs end: on the default model through the official openai client, forced
tool calls (`tool_choice` "required" and a named function) and `json_schema` answers over
schemas that leave `additionalProperties` unsaid and hold unbounded integers, numbers and
nested objects, greedy and sampled, streamed and not, all end by themselves within 96
tokens as JSON that validates against the client's schema (jsonschema, an independent
validator) and holds no property the schema does not list.

Before objects were closed and numbers bounded, a base model filled such objects with
invented keys and wrote integers until `max_tokens` cut the JSON (docs/structured_outputs.md
has the counts). CI runs one seed per sampled case; MIMO_CONSTRAINED_SEEDS=N runs N."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

MODEL = "gemma-3-270m"
MAX_TOKENS = 96
SEEDS = int(os.environ.get("MIMO_CONSTRAINED_SEEDS", "1"))
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "integer"}}}},
    "required": ["name", "age", "address"]}
READING = {"type": "object", "properties": {
    "sensor": {"type": "string", "maxLength": 16}, "value": {"type": "number"},
    "count": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["sensor", "value", "count", "ok"]}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0},
    "lines": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer"}},
        "required": ["sku", "qty"]}}},
    "required": ["id", "lines"], "additionalProperties": False}
ANSWERS = {"person": (PERSON, "Invent a person and answer with their record as JSON."),
           "reading": (READING, "Report a thermometer reading as JSON."),
           "order": (ORDER, "Write a shop order with two lines as JSON.")}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "options": {"type": "object", "properties": {"unit": {"enum": ["C", "F"]},
                                                 "hourly": {"type": "boolean"}}}},
    "required": ["city", "days"]}
NOTE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                         "priority": {"type": "integer"}},
        "required": ["title", "priority"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add_note", "description": "Save a note",
                                           "parameters": NOTE}}]
TOOL_SCHEMA = {"get_weather": WEATHER, "add_note": NOTE}
ASK = [{"role": "user", "content": "What will the weather be in Lisbon for the next 4 days?"}]


def unlisted_keys(value, schema) -> list:
    """Keys of `value`'s objects that their schema does not list (schemas here are plain:
    properties / items only)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return [k for k in value if k not in props] + [
            x for k, v in value.items() if k in props for x in unlisted_keys(v, props[k])]
    if isinstance(value, list):
        return [x for v in value for x in unlisted_keys(v, schema.get("items", {}))]
    return []


def _cases(kinds):
    return [(k, t, s, seed) for k in kinds for t in (0.0, 0.9) for s in (False, True)
            for seed in (range(SEEDS) if t else [0])]


def _collect(stream) -> tuple[str, dict, str | None, int]:
    """A streamed answer -> (content, {index: [name, arguments]}, finish_reason, tokens)."""
    content, calls, finish, tokens = "", {}, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, ["", ""])
                c[0] += (tc.function.name or "") if tc.function else ""
                c[1] += (tc.function.arguments or "") if tc.function else ""
            finish = ch.finish_reason or finish
    return content, calls, finish, tokens


def _answer(client, case):
    kind, temperature, stream, seed = case
    schema, prompt = ANSWERS[kind]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt}],
              max_tokens=MAX_TOKENS, temperature=temperature, seed=seed,
              response_format={"type": "json_schema",
                               "json_schema": {"name": kind, "schema": schema}})
    if stream:
        content, _, finish, tokens = _collect(client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
    else:
        r = client.chat.completions.create(**kw)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        tokens = r.usage.completion_tokens
    return case, content, finish, tokens


def _call(client, case):
    choice, temperature, stream, seed = case
    tc = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tc, max_tokens=MAX_TOKENS,
              temperature=temperature, seed=seed)
    if stream:
        _, calls, finish, tokens = _collect(client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
        got = [tuple(c) for _, c in sorted(calls.items())]
    else:
        r = client.chat.completions.create(**kw)
        ch = r.choices[0]
        got = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls or []]
        finish, tokens = ch.finish_reason, r.usage.completion_tokens
    return case, got, finish, tokens


def _run(fn, client, cases):
    # A few at a time: the server batches them, as it would any clients.
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: fn(client, c), cases))


def test_json_schema_answers_end_as_valid_json(client):
    bad = []
    for case, content, finish, tokens in _run(_answer, client, _cases(ANSWERS)):
        schema = ANSWERS[case[0]][0]
        try:
            assert finish == "stop" and tokens <= MAX_TOKENS, (finish, tokens)
            value = json.loads(content)
            jsonschema.validate(value, schema)
            assert not unlisted_keys(value, schema), unlisted_keys(value, schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append((case, content, str(e)[:200]))
    assert not bad, bad


def test_forced_tool_calls_end_with_valid_arguments(client):
    bad = []
    for case, got, finish, tokens in _run(_call, client, _cases(["required", "add_note"])):
        try:
            assert finish == "tool_calls" and tokens <= MAX_TOKENS, (finish, tokens)
            assert len(got) == 1, got
            name, arguments = got[0]
            if case[0] != "required":
                assert name == case[0]
            args = json.loads(arguments)
            jsonschema.validate(args, TOOL_SCHEMA[name])
            assert not unlisted_keys(args, TOOL_SCHEMA[name]), args
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append((case, got, str(e)[:200]))
    assert not bad, bad


@pytest.mark.parametrize("value, schema, listed", [
    ({"a": 1, "b": {"c": 2, "d": 3}}, {"properties": {"a": {}, "b": {"properties": {"c": {}}}}},
     ["d"]),
    ({"x": [{"y": 1, "z": 2}]}, {"properties": {"x": {"items": {"properties": {"y": {}}}}}},
     ["z"]),
])
def test_unlisted_keys_finds_them(value, schema, listed):
    assert unlisted_keys(value, schema) == listed
