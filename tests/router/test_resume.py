"""The router's stream resumption (mimo/router/resume.py) on hand-written SSE streams:
which requests are resumed, the regenerated stream cut to what the client lacks (split at
other event boundaries, the original id/created/system_fingerprint kept), tool calls, and a
regenerated stream that differs. The expected outputs are written out by hand."""
from __future__ import annotations

import json

import pytest

from mimo.router.resume import Events, Mismatch, Replay, Track, resumable


def _sse(objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + \
        b"data: [DONE]\n\n"


def _chat(rid, pieces, finish="length", usage=True):
    evs = [{"id": rid, "created": 1, "object": "chat.completion.chunk", "system_fingerprint": rid,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "finish_reason": None}]}]
    for p in pieces:
        delta = p if isinstance(p, dict) else {"content": p}
        evs.append({"id": rid, "created": 2, "object": "chat.completion.chunk",
                    "system_fingerprint": rid,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    evs.append({"id": rid, "created": 2, "system_fingerprint": rid,
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage:
        evs.append({"id": rid, "created": 2, "choices": [], "usage": {"completion_tokens": 9}})
    return evs


def _client_gets(first: bytes, cut: int, again: bytes, split: int = 7) -> tuple[int, list]:
    """The client reads `first` up to byte `cut` (whole events only), then the replay of
    `again` fed in `split`-byte pieces. How many of `first`'s events it had, what it got."""
    track, ev = Track(), Events()
    got = []
    for e in ev.feed(first[:cut]):
        track.note(e)
        got.append(e)
    rp, had = Replay(track), len(got)
    for i in range(0, len(again), split):
        got += rp.feed(again[i:i + split])
    return had, got


def _content(got) -> tuple[str, set, list]:
    objs = [json.loads(g[6:]) for g in got if g.startswith(b"data: {")]
    text = "".join(o["choices"][0]["delta"].get("content") or "" for o in objs if o["choices"])
    return text, {(o["id"], o["created"]) for o in objs}, [g for g in got if b"[DONE]" in g]


@pytest.mark.parametrize("cut", [40, 200, 330, 420, 600, 700, -14])
def test_regenerated_stream_continues_where_the_client_is(cut):
    first = _sse(_chat("A", ["Hel", "lo", " wor", "ld"]))
    again = _sse(_chat("B", ["He", "llo w", "orl", "d"]))       # other event boundaries
    had, got = _client_gets(first, cut, again)      # -14: all but the [DONE]
    text, ids, done = _content(got)
    assert text == "Hello world" and len(done) == 1
    # The original stream's id throughout once the client has one of its events.
    assert {i for i, _ in ids} == ({"A"} if had else {"B"})
    objs = [json.loads(g[6:]) for g in got if g.startswith(b"data: {")]
    assert [o["usage"] for o in objs if not o["choices"]] == [{"completion_tokens": 9}]
    assert sum(1 for o in objs if o["choices"] and o["choices"][0]["finish_reason"]) == 1
    rid = "A" if had else "B"
    assert all(o.get("system_fingerprint", rid) == rid for o in objs)


def test_differing_content_and_tool_calls():
    first = _sse(_chat("A", ["Hel", "lo", " wor", "ld"]))
    three = sum(len(e) for e in Events().feed(first)[:3])      # the client has "Hello"
    with pytest.raises(Mismatch):
        _client_gets(first, three, _sse(_chat("B", ["Hel", "p!", " wor", "ld"])))
    with pytest.raises(Mismatch):
        _client_gets(first, three, _sse(_chat("B", ["He"])))   # ends short of it
    call = [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]
    args = [{"index": 0, "function": {"arguments": '{"a": 1}'}}]
    first = _sse(_chat("A", [{"tool_calls": call}, {"tool_calls": args}]))
    ev = Events().feed(first)
    cut = sum(len(e) for e in ev[:2])
    _, got = _client_gets(first, cut, _sse(_chat("B", [{"tool_calls": call},
                                                           {"tool_calls": args}])))
    objs = [json.loads(g[6:]) for g in got if g.startswith(b"data: {")]
    assert objs[2]["choices"][0]["delta"] == {"tool_calls": args} and objs[2]["id"] == "A"
    assert len(objs) == 5           # role, call, arguments, finish, usage: none twice
    # A tool call that would have to be cut mid-event is not resumed.
    split = [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    with pytest.raises(Mismatch):
        _client_gets(first, cut, _sse(_chat("B", [{"tool_calls": split}])))


def test_which_requests_are_resumed():
    assert resumable("completion", {"temperature": 0})
    assert resumable("chat", {"temperature": 0.7, "seed": 3})
    assert resumable("chat", {"temperature": 0, "n": 1})
    for kind, body in [("completion", {}), ("chat", {"temperature": 0.7}),
                       ("chat", {"temperature": 0, "n": 2}),
                       ("completion", {"temperature": 0, "logprobs": 2}),
                       ("chat", {"temperature": 0, "logprobs": True}),
                       ("chat", {"seed": True}), ("responses", {"temperature": 0}),
                       ("completion", {"temperature": 0, "best_of": 3})]:
        assert not resumable(kind, body), (kind, body)
