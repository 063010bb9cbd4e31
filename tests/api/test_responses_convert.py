"""The Responses conversions on their own (no server): input items -> chat messages, checked
against chat messages written out by hand; the output builder's stream events, accumulated
by the openai package's own stream state (independent of the builder), give exactly the
builder's items, for every order of reasoning, text and calls."""
from __future__ import annotations

import itertools
import json

import pytest

from mimo.api.errors import APIError
from mimo.api.responses.items import check_call_outputs, parse_input, to_messages
from mimo.api.responses.output import OutputBuilder
from mimo.tools import ToolCall


def test_items_to_messages():
    items = parse_input([
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                         "text": "hmm"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "t"}, {"type": "input_text", "text": "wo"}]},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ])
    check_call_outputs([], items)
    assert to_messages("Sys.", items) == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    ]
    assert len({it["id"] for it in items}) == len(items)      # every item has its own id


def test_a_call_before_the_text_is_one_assistant_message():
    """Output written as [reasoning, call, reasoning, text] (a call inside the thinking
    block) goes back as chat's answer to it: one message, the text and the call."""
    items = parse_input([
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                         "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "reasoning", "summary": []},
        {"role": "assistant", "content": "Answer."},
        {"type": "function_call_output", "call_id": "c1", "output": "r"}])
    assert to_messages(None, items) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Answer.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]


def test_images_become_image_url_parts():
    items = parse_input([{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]}])
    assert to_messages(None, items) == [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                            "detail": "low"}}]}]


def test_call_outputs_must_answer_an_earlier_call():
    ctx = parse_input([{"type": "function_call", "call_id": "c1", "name": "f",
                        "arguments": "{}"}])
    check_call_outputs(ctx, parse_input([{"type": "function_call_output", "call_id": "c1",
                                          "output": "x"}]))
    with pytest.raises(APIError) as e:
        check_call_outputs(ctx, parse_input([{"type": "function_call_output",
                                              "call_id": "c2", "output": "x"}]))
    assert e.value.status == 400 and e.value.param == "input"


class FakeChoice:
    def __init__(self):
        self.calls, self.call_ids = [], []


PIECES = {"r": ("reasoning", ["Thinking ", "hard."]), "t": ("content", ["Hello", " there."]),
          "c": ("call", None)}


def _run(order: str, status: str):
    ch, b = FakeChoice(), None
    b = OutputBuilder(ch)
    events = []
    for k in order:
        kind, texts = PIECES[k]
        if kind == "call":
            ch.calls.append(ToolCall("f", json.dumps({"n": len(ch.calls)})))
            ch.call_ids.append(f"call_{len(ch.calls)}")
            events += b.feed([("call", len(ch.calls) - 1)])
        else:
            for t in texts:
                events += b.feed([(kind, t)])
    events += b.finish(status)
    return b.items, events


@pytest.mark.parametrize("order", ["".join(p) for n in range(4)
                                   for p in itertools.product("rtc", repeat=n)])
@pytest.mark.parametrize("status", ["completed", "incomplete"])
def test_events_accumulate_into_the_items(order, status):
    from openai import omit
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter
    items, events = _run(order, status)
    resp = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
            "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "status": "in_progress"}
    seq = [{"type": "response.created", "response": resp}] + events
    ta = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=omit)
    for i, e in enumerate(seq):
        state.handle_event(ta.validate_python({**e, "sequence_number": i}))
    want = [_strip(it) for it in items]
    # Built from the added events and the deltas (status as added: in progress; the SDK
    # accumulates no reasoning deltas: those are joined here) ...
    snap = state._ResponseStreamState__current_snapshot
    rs = {}
    for e in events:
        if e["type"] == "response.reasoning_text.delta":
            rs[e["item_id"]] = rs.get(e["item_id"], "") + e["delta"]
    got = [_strip(o.model_dump(mode="json")) for o in snap.output]
    for g in got:
        if g["type"] == "reasoning":
            g["text"] = rs.get(g["id"], "")
    assert got == [{**w, "status": "in_progress"} for w in want]
    # ... and as the done events finished them.
    done = [state._completed_output[i] for i in sorted(state._completed_output)]
    assert [_strip(o.model_dump(mode="json")) for o in done] == want
    # Each kind of output in written order; text and reasoning whole.
    kinds = [{"reasoning": "r", "message": "t", "function_call": "c"}[it["type"]]
             for it in items]
    runs = "".join(k for i, k in enumerate(order) if k == "c" or i == 0 or order[i - 1] != k)
    if "t" not in runs and "c" not in runs:
        runs += "t"             # no text and no call: an empty message
    assert kinds == list(runs)
    for it in items:
        assert it["status"] in ("completed", status)


def _strip(item: dict) -> dict:
    """The fields both sides carry (the SDK adds parsed views and drops empty ones)."""
    out = {k: v for k, v in item.items() if k in ("id", "type", "status", "call_id", "name",
                                                 "arguments", "role")}
    if "content" in item:
        out["text"] = "".join(p.get("text", "") for p in item["content"] or [])
    return out
