"""The tool-call and reasoning parsers on a table of outputs in each family's real format
(MiMo-V2-Flash's XML calls, Hermes JSON calls of Qwen2.5 / SmolLM2, Gemma's tool_code), calls
inside and after thinking blocks included; and streaming: the output fed in pieces split at
every position gives exactly the events of the whole. Whitespace around calls is held back and
dropped (streamed and whole alike); a call the client cannot take (an undeclared function, a
strict function's invalid arguments) stays text."""
from __future__ import annotations

import json

import pytest

from mimo.tools import FORMATS, OutputParser, ToolCall

SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer"}}},
           "search": {"type": "object", "properties": {"query": {"type": "string"},
                                                       "filters": {"type": "object"}}}}


def call(name, **args) -> ToolCall:
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


W = call("get_weather", city="Paris", days=3)
S = call("search", query="hybrid attention", filters={"year": 2025})

# (id, family, output, reasoning, content, calls)
TABLE = [
    # ---- MiMo-V2-Flash: <think> reasoning, XML calls (Qwen3-Coder style)
    ("mimo-xml", "mimo",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "", "", [W]),
    ("mimo-think-then-call", "mimo",
     "<think>The user wants the weather.</think>\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
     "</tool_call>", "The user wants the weather.", "", [W]),
    ("mimo-call-inside-think", "mimo",
     "<think>I should look it up. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call> done</think>"
     "Checking.", "I should look it up.  done", "Checking.", [W]),
    ("mimo-two-calls", "mimo",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>"
     "\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
     "<parameter=query>\nhybrid attention\n</parameter>\n<parameter=filters>\n{\"year\": 2025}\n"
     "</parameter>\n</function>\n</tool_call>", "", "", [W, S]),
    ("mimo-json-call", "mimo",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
     '</tool_call>', "", "", [W]),
    ("mimo-unterminated-call", "mimo",
     "<think>ok</think><tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>"
     "\n<parameter=days>\n3\n</parameter>\n</function>", "ok", "", [W]),
    ("mimo-plain-text", "mimo", "<think>hmm</think>The answer is 4.", "hmm", "The answer is 4.",
     []),
    ("mimo-no-think", "mimo", "Just text, < and <tool not a call.", "",
     "Just text, < and <tool not a call.", []),
    ("mimo-string-param-kept-raw", "mimo",
     "<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n</function>\n"
     "</tool_call>", "", "", [call("search", query="42")]),
    # ---- Hermes JSON (Qwen2.5, SmolLM2)
    ("hermes-one", "hermes",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
     "", "", [W]),
    ("hermes-text-then-call", "hermes",
     'Let me check.\n<tool_call>\n{"name": "search", "arguments": {"query": "hybrid attention", '
     '"filters": {"year": 2025}}}\n</tool_call>', "", "Let me check.", [S]),
    ("hermes-list", "hermes",
     '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
     '{"name": "search", "arguments": {"query": "hybrid attention", "filters": {"year": 2025}}}]'
     '</tool_call>', "", "", [W, S]),
    ("hermes-parameters-key", "hermes",
     '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}</tool_call>',
     "", "", [W]),
    ("hermes-string-arguments", "hermes",
     '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}'
     '</tool_call>', "", "", [W]),
    ("hermes-broken-json-stays-text", "hermes", '<tool_call>{"name": "get_weather", </tool_call>',
     "", '<tool_call>{"name": "get_weather", </tool_call>', []),
    ("hermes-no-think-parsing", "hermes", "<think>x</think>y", "", "<think>x</think>y", []),
    # ---- Gemma 3: tool_code (Python calls) or the JSON fallback
    ("gemma-tool-code", "gemma",
     '```tool_code\nget_weather(city="Paris", days=3)\n```', "", "", [W]),
    ("gemma-tool-code-two", "gemma",
     '```tool_code\nget_weather(city="Paris", days=3)\nsearch(query="hybrid attention", '
     'filters={"year": 2025})\n```', "", "", [W, S]),
    ("gemma-json", "gemma",
     'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
     '</tool_call>', "", "Sure.", [W]),
    # ---- whitespace around calls: dropped when calls are found, kept in plain text
    ("hermes-whitespace-around-calls", "hermes",
     '\n\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
     '</tool_call>\n \n<tool_call>{"name": "search", "arguments": {"query": "hybrid attention", '
     '"filters": {"year": 2025}}}</tool_call>\n\n', "", "", [W, S]),
    ("hermes-text-between-calls", "hermes",
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>'
     '\n\nThen \n<tool_call>{"name": "search", "arguments": {"query": "hybrid attention", '
     '"filters": {"year": 2025}}}</tool_call> \n', "", "\n\nThen", [W, S]),
    ("hermes-plain-text-keeps-whitespace", "hermes", "\n\nNo call here. \n\n", "",
     "\n\nNo call here. \n\n", []),
    # ---- calls the client cannot take stay text
    ("hermes-undeclared-function", "hermes",
     'Sure. <tool_call>{"name": "delete_all", "arguments": {}}</tool_call>', "",
     'Sure. <tool_call>{"name": "delete_all", "arguments": {}}</tool_call>', []),
    ("gemma-undeclared-tool-code", "gemma", '```tool_code\nos_system(cmd="x")\n```', "",
     '```tool_code\nos_system(cmd="x")\n```', []),
    ("mimo-undeclared-xml", "mimo",
     "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "",
     "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", []),
    ("gemma-code-not-a-call", "gemma", "```tool_code\nprint(1 +)\n```", "",
     "```tool_code\nprint(1 +)\n```", []),
]


def run(fmt: str, pieces: list[str], tools: bool = True):
    p = OutputParser(FORMATS[fmt], tools=tools, reasoning=True, schemas=SCHEMAS)
    events = []
    for piece in pieces:
        events += p.feed(piece)
    events += p.finish()
    return p.out, events


def merged(events):
    """Events with adjacent text of one kind joined (stream boundaries fall anywhere)."""
    out = []
    for kind, v in events:
        if kind != "call" and out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + v)
        else:
            out.append((kind, v))
    return out


@pytest.mark.parametrize("case", TABLE, ids=lambda c: c[0])
def test_parser_table(case):
    _, fmt, text, reasoning, content, calls = case
    out, events = run(fmt, [text])
    assert out.reasoning == reasoning
    assert out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == \
        [(c.name, json.loads(c.arguments)) for c in calls]
    # streamed in two pieces split anywhere, or one character at a time: the same events
    for cut in range(len(text) + 1):
        _, ev = run(fmt, [text[:cut], text[cut:]])
        assert merged(ev) == merged(events), cut
    _, ev = run(fmt, list(text))
    assert merged(ev) == merged(events)


def test_tools_off_leaves_calls_as_text():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    out, _ = run("hermes", [text], tools=False)
    assert out.content == text and not out.calls


STRICT = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "maximum": 2}},
    "required": ["city"], "additionalProperties": False}}


@pytest.mark.parametrize("text,is_call", [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>',
     False),                                                    # days over the maximum
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}</tool_call>',
     False),                                                    # a property not listed
    ('<tool_call>{"name": "get_weather", "arguments": {"days": 1}}</tool_call>', False),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
     True),
    ('<tool_call>{"name": "search", "arguments": {"query": 5}}</tool_call>', True),  # not strict
])
def test_strict_functions_take_only_valid_arguments(text, is_call):
    for pieces in ([text], list(text)):
        p = OutputParser(FORMATS["hermes"], True, True, SCHEMAS, STRICT)
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        assert bool(p.out.calls) == is_call
        assert p.out.content == ("" if is_call else text)
        assert "".join(v for k, v in events if k == "content") == p.out.content


def test_no_declarations_take_any_name():
    p = OutputParser(FORMATS["hermes"], True)
    p.feed('<tool_call>{"name": "anything", "arguments": {}}</tool_call>')
    p.finish()
    assert [c.name for c in p.out.calls] == ["anything"]
