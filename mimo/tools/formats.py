"""The formats models write tool calls in, per family, as (start marker, end marker, block
parser), and the reasoning block's markers where the family has one.

    hermes JSON  <tool_call>{"name": f, "arguments": {...}}</tool_call>   (Qwen2.5, SmolLM2
                 and the fallback every family accepts; a list of calls, or "parameters"
                 for "arguments", is taken too)
    MiMo XML     <tool_call><function=f><parameter=k>v</parameter>...</function></tool_call>
                 (MiMo-V2-Flash; Qwen3-Coder style: a value is raw text, decoded as JSON
                 unless the tool's schema says string), reasoning in <think>...</think>
    tool_code    ```tool_code\\nf(k=1, s="x")\\n```   (Gemma 3's Python-call convention)
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str            # a JSON object, as OpenAI sends it


Parser = Callable[[str, dict], "list[ToolCall] | None"]


def _dump(args) -> str:
    return json.dumps(args, ensure_ascii=False)


def parse_json_calls(block: str, schemas: dict) -> list[ToolCall] | None:
    try:
        v = json.loads(block.strip())
    except ValueError:
        return None
    items = v if isinstance(v, list) else [v]
    out = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            return None
        args = it.get("arguments", it.get("parameters", {}))
        if isinstance(args, str):       # some models nest the JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        out.append(ToolCall(it["name"], _dump(args)))
    return out or None


_FUNC = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def _xml_value(raw: str, schema: dict | None):
    v = raw[1:] if raw.startswith("\n") else raw
    v = v[:-1] if v.endswith("\n") else v
    if (schema or {}).get("type") == "string":
        return v
    try:
        return json.loads(v)
    except ValueError:
        return v


def parse_xml_calls(block: str, schemas: dict) -> list[ToolCall] | None:
    funcs = _FUNC.findall(block)
    if not funcs:
        return parse_json_calls(block, schemas)
    out = []
    for name, body in funcs:
        props = (schemas.get(name) or {}).get("properties", {})
        args = {k: _xml_value(v, props.get(k)) for k, v in _PARAM.findall(body)}
        out.append(ToolCall(name, _dump(args)))
    return out


def parse_tool_code(block: str, schemas: dict) -> list[ToolCall] | None:
    try:
        tree = ast.parse(block.strip(), mode="exec")
    except SyntaxError:
        return None
    out = []
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, (ast.Name, ast.Attribute)):
            return None
        name = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
        if call.args:
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
        except ValueError:
            return None
        out.append(ToolCall(name, _dump(args)))
    return out or None


@dataclass(frozen=True)
class Marker:
    start: str
    end: str
    parse: Parser


@dataclass(frozen=True)
class ToolFormat:
    name: str
    markers: tuple[Marker, ...]
    reasoning: tuple[str, str] | None = None     # (start, end) of a thinking block
    # How a call is written back into a prompt (history of a template without tool support,
    # and the text a forced call is constrained to).
    call_prefix: str = "<tool_call>\n"
    call_suffix: str = "\n</tool_call>"
    # How arguments are written between the markers: "json" ({"name", "arguments"}) or
    # "xml" (<function=NAME> and one <parameter=KEY> block per argument, MiMo's).
    args: str = "json"
    extra: dict = field(default_factory=dict)

    def write(self, name: str, arguments) -> str:
        args = arguments if isinstance(arguments, dict) else json.loads(arguments or "{}")
        if self.args == "xml":
            params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else _dump(v)}\n"
                             f"</parameter>\n" for k, v in args.items())
            body = f"<function={name}>\n{params}</function>"
        else:
            body = _dump({"name": name, "arguments": args})
        return f"{self.call_prefix}{body}{self.call_suffix}"


HERMES = Marker("<tool_call>", "</tool_call>", parse_json_calls)
MIMO_XML = Marker("<tool_call>", "</tool_call>", parse_xml_calls)
TOOL_CODE = Marker("```tool_code", "```", parse_tool_code)

FORMATS = {
    "hermes": ToolFormat("hermes", (HERMES,)),
    "mimo": ToolFormat("mimo", (MIMO_XML,), reasoning=("<think>", "</think>"), args="xml"),
    "gemma": ToolFormat("gemma", (HERMES, TOOL_CODE)),
}
_BY_ARCH = {"mimo_v2_flash": "mimo", "gemma3": "gemma", "llama": "hermes",
            "qwen2_5_vl": "hermes"}


def format_for(arch: str | None) -> ToolFormat:
    return FORMATS[_BY_ARCH.get(arch or "", "hermes")]
