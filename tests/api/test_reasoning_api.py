"""Reasoning and tool calls of a MiMo-V2-Flash-family model, end to end: the real server on
127.0.0.1 serving a tiny MiMo-V2-Flash checkpoint (tests/api/forced_mimo.py) whose greedy
output, through the real decode path, is a fixed text in MiMo's format, picked per request
by `logit_bias`. Through the official openai client: the `<think>` block goes into
`reasoning_content`, a tool call written after the block or inside it is still a call, and
streamed deltas (reasoning, content, tool calls) assemble into exactly the non-streamed
message; also with MTP speculative decoding (the checkpoint's 2 MTP layers), whose
logprobs are those of plain decoding."""
from __future__ import annotations

import json
import math

import forced_mimo as fm
import jsonschema
import pytest
from helpers.api_server import ServerProcess

MODEL = "tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer", "minimum": 1}},
           "required": ["city"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}},
          "required": ["query"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "description": "Web search",
                                           "parameters": SEARCH}}]
SCHEMA = {"get_weather": WEATHER, "search": SEARCH}
ASK = [{"role": "user", "content": "What is the weather in Paris for three days?"}]

# What each text must come out as: (reasoning_content, content, [(name, arguments)]).
WANT = {
    "after": ("The user wants the weather in Paris.", None,
              [("get_weather", {"city": "Paris", "days": 3})]),
    "inside": ("Let me look it up. \nWaiting for the result.", "I will answer once it returns.",
               [("search", {"query": "weather Paris"})]),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("forced_mimo")
    fm.write(d)
    return d


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _serve(model_dir, *extra):
    return ServerProcess("--model", str(model_dir), "--served-model-name", MODEL, "--dtype",
                         "float32", "--kv-cache-memory", "32MiB", *extra)


@pytest.fixture(scope="module")
def servers(model_dir):
    plain = _serve(model_dir)
    try:
        mtp = _serve(model_dir, "--speculative", "mtp", "--num-draft-tokens", "2")
    except BaseException:
        plain.stop()
        raise
    yield {"plain": plain, "mtp": mtp}
    plain.stop()
    mtp.stop()


@pytest.fixture(params=["plain", "mtp"])
def any_server(request, servers):
    return servers[request.param]


def _client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _ask(client, tokenizer, text: str, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=64, temperature=0,
        logit_bias=fm.ban_for(tokenizer, text), **kw)


def _calls(message) -> list[tuple[str, dict]]:
    out = []
    for c in message.tool_calls or []:
        assert c.type == "function" and c.id.startswith("call_")
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMA[c.function.name])
        out.append((c.function.name, args))
    return out


@pytest.mark.parametrize("text", ["after", "inside"])
def test_thinking_block_is_reasoning_and_the_call_is_found(any_server, tokenizer, text):
    r = _ask(_client(any_server), tokenizer, text, tools=TOOLS)
    ch = r.choices[0]
    reasoning, content, calls = WANT[text]
    assert ch.message.reasoning_content == reasoning
    assert ch.message.content == content
    assert _calls(ch.message) == calls
    assert ch.finish_reason == "tool_calls"
    # The model wrote exactly the fixed text: every token of it is counted.
    assert r.usage.completion_tokens == len(fm.TEXTS[text])


@pytest.mark.parametrize("text", ["after", "inside"])
def test_streamed_deltas_assemble_into_the_message(any_server, tokenizer, text):
    client = _client(any_server)
    whole = _ask(client, tokenizer, text, tools=TOOLS).choices[0].message
    reasoning, content, finish = [], [], None
    calls: dict[int, dict] = {}
    for chunk in _ask(client, tokenizer, text, tools=TOOLS, stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            d = ch.delta
            if getattr(d, "reasoning_content", None):
                reasoning.append(d.reasoning_content)
            if d.content:
                content.append(d.content)
            for t in d.tool_calls or []:
                c = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = c["id"] or t.id
                c["name"] += t.function.name or ""
                c["arguments"] += t.function.arguments or ""
    assert finish == "tool_calls"
    assert "".join(reasoning) == whole.reasoning_content
    assert len(reasoning) > 1                     # streamed as it came, not at the end
    # The whitespace around a call is neither streamed nor in the message (None when nothing
    # is left): the deltas assemble into exactly the message's content.
    assert "".join(content) == (whole.content or "")
    if text == "after":
        assert content == [] and whole.content is None      # "\n\n" before the call
    assert not any("<" in c for c in content + reasoning)     # no partial tag ever leaks
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_without_tools_the_call_stays_text(servers, tokenizer):
    """No tools in the request: the block is still reasoning; the call is left as text."""
    ch = _ask(_client(servers["plain"]), tokenizer, "after").choices[0]
    assert ch.message.reasoning_content == WANT["after"][0]
    assert ch.message.tool_calls is None and ch.finish_reason == "stop"
    assert ch.message.content == "".join(fm.AFTER[4:-1])


def _strict_weather(maximum_days: int) -> dict:
    params = {**WEATHER, "properties": {**WEATHER["properties"],
                                        "days": {"type": "integer", "maximum": maximum_days}}}
    return {"type": "function", "function": {"name": "get_weather", "strict": True,
                                             "parameters": params}}


@pytest.mark.parametrize("case", ["undeclared", "strict-invalid"])
def test_a_call_the_client_cannot_take_is_content(servers, tokenizer, case):
    """tool_choice auto: the model calls get_weather(city="Paris", days=3). Declared tools
    without get_weather, or a strict get_weather whose schema caps days at 2: no tool_calls,
    the call's text is the content (streamed the same), finish_reason stop."""
    tools = [TOOLS[1]] if case == "undeclared" else [_strict_weather(2), TOOLS[1]]
    client = _client(servers["plain"])
    r = _ask(client, tokenizer, "after", tools=tools)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and ch.finish_reason == "stop"
    assert ch.message.content == "".join(fm.AFTER[4:-1])
    assert ch.message.reasoning_content == WANT["after"][0]
    content, finish = [], None
    for chunk in _ask(client, tokenizer, "after", tools=tools, stream=True):
        for c in chunk.choices:
            assert not c.delta.tool_calls
            content.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(content) == ch.message.content and finish == "stop"


def test_a_strict_call_whose_arguments_validate_is_a_call(servers, tokenizer):
    r = _ask(_client(servers["plain"]), tokenizer, "after", tools=[_strict_weather(3)])
    assert _calls(r.choices[0].message) == WANT["after"][2]
    assert r.choices[0].finish_reason == "tool_calls"


def test_logprobs_are_the_raw_distribution_with_and_without_mtp(servers, tokenizer):
    """At the text's forks the model gives both successors the same logit; logit_bias picks
    one, yet the reported logprob is the raw distribution's: log(1/2). MTP on reports the
    same values as plain decoding."""
    def accepted(s) -> float:
        return s.metric("mimo_spec_emitted_tokens_total") - s.metric("mimo_spec_verify_steps_total")

    before = accepted(servers["mtp"])
    got = {}
    for name, s in servers.items():
        r = _ask(_client(s), tokenizer, "after", tools=TOOLS, logprobs=True, top_logprobs=2)
        got[name] = r.choices[0].logprobs.content
    # Multi-token steps happened: the MTP layers draft the same chain (forced_mimo.py).
    assert accepted(servers["mtp"]) - before >= 3
    plain, mtp = got["plain"], got["mtp"]
    assert [c.token for c in plain] == [c.token for c in mtp] == fm.AFTER
    for a, b in zip(plain, mtp):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        assert [t.logprob for t in a.top_logprobs] == pytest.approx(
            [t.logprob for t in b.top_logprobs], abs=1e-4)
    forks = {i for i, c in enumerate(fm.AFTER) if c in ("The user wants", "\n\n<tool")}
    for i, c in enumerate(plain):
        if i in forks:
            assert c.logprob == pytest.approx(math.log(0.5), abs=1e-3)
            assert [t.logprob for t in c.top_logprobs] == pytest.approx([math.log(0.5)] * 2,
                                                                   abs=1e-3)
        else:
            assert c.logprob == pytest.approx(0.0, abs=1e-3)


def test_multi_turn_after_a_tool_result(any_server, tokenizer):
    """The turn after a tool result (where the thinking block has leaked into `content`
    elsewhere): the assistant message sent back as the client got it (reasoning_content
    included), then the result; the next answer's block is reasoning again, its call found."""
    import httpx
    client = _client(any_server)
    first = _ask(client, tokenizer, "after", tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    history = ASK + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                       max_tokens=64, temperature=0,
                                       logit_bias=fm.ban_for(tokenizer, "inside"))
    msg = r.choices[0].message
    reasoning, content, calls = WANT["inside"]
    assert (msg.reasoning_content, msg.content, _calls(msg)) == (reasoning, content, calls)
    # What the model saw (/tokenize renders as generation does, the tools too): the tool
    # list, the first call (written back in MiMo's form) and its result, in the template's
    # turns.
    ids = httpx.post(any_server.url + "/tokenize", json={"messages": history,
                                                         "tools": TOOLS}).json()["tokens"]
    assert r.usage.prompt_tokens == len(ids)
    text = httpx.post(any_server.url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert '"temperature": 21' in text and "Web search" in text
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" in text
    bare = httpx.post(any_server.url + "/tokenize", json={"messages": history}).json()["tokens"]
    assert len(bare) < len(ids)
    none = httpx.post(any_server.url + "/tokenize", json={"messages": history, "tools": TOOLS,
                                                          "tool_choice": "none"}).json()
    assert none["tokens"] == bare              # tool_choice none: no tool list, as generation
    bad = httpx.post(any_server.url + "/tokenize", json={"messages": history, "tools": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
