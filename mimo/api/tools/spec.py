"""`tools` / `tool_choice` (and the legacy `functions` / `function_call`) -> ToolSpec, each
field checked as OpenAI documents it; errors name the field."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import bad_request
from ..fields import boolean, kind_of, string

NAME = re.compile(r"^[a-zA-Z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict          # a JSON schema of the arguments object
    strict: bool = False      # function.strict: the arguments must validate (OpenAI's strict)


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[Tool, ...]
    choice: str               # 'none' | 'auto' | 'required' | 'named'
    named: str | None         # the forced function's name (choice 'named')
    legacy: bool              # sent as functions / function_call: answer with function_call
    parallel: bool            # parallel_tool_calls

    @property
    def forced(self) -> tuple[Tool, ...]:
        """The tools a forced choice constrains the output to (empty: not forced)."""
        if self.choice == "required":
            return self.tools
        if self.choice == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return ()

    @property
    def active(self) -> bool:
        return self.choice != "none" and bool(self.tools)

    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (OpenAI's shape)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}}
                for t in self.tools]


def _function(f, where: str, param: str) -> Tool:
    if not isinstance(f, dict):
        raise bad_request(f"'{where}' must be an object, got {kind_of(f)}", param)
    name = string(f, "name", where=f"{where}.name", param=param)
    if name is None or not NAME.match(name):
        raise bad_request(f"'{where}.name' must be 1-64 characters of a-z, A-Z, 0-9, _, . "
                          f"and -, got {name!r}", param)
    desc = string(f, "description", "", where=f"{where}.description", param=param)
    params = f.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise bad_request(f"'{where}.parameters' must be a JSON schema object, got "
                          f"{kind_of(params)}", param)
    if "strict" in f and not isinstance(f["strict"], bool):
        raise bad_request(f"'{where}.strict' must be a boolean", param)
    return Tool(name, desc or "", params, bool(f.get("strict")))


def _tools(body: dict) -> tuple[tuple[Tool, ...], bool]:
    tools, functions = body.get("tools"), body.get("functions")
    if tools is not None and functions is not None:
        raise bad_request("send 'tools' or the legacy 'functions', not both", "functions")
    legacy = tools is None and functions is not None
    raw, param = (functions, "functions") if legacy else (tools, "tools")
    if raw is None:
        return (), False
    if not isinstance(raw, list):
        raise bad_request(f"'{param}' must be an array, got {kind_of(raw)}", param)
    if len(raw) > 128:
        raise bad_request(f"'{param}' takes at most 128 tools", param)
    out = []
    for i, t in enumerate(raw):
        where = f"{param}[{i}]"
        if legacy:
            out.append(_function(t, where, param))
            continue
        if not isinstance(t, dict):
            raise bad_request(f"'{where}' must be an object, got {kind_of(t)}", param)
        if t.get("type") != "function":
            raise bad_request(f"'{where}.type' must be 'function', got {t.get('type')!r}", param)
        out.append(_function(t.get("function"), f"{where}.function", param))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise bad_request(f"'{param}' has two functions of the same name", param)
    return tuple(out), legacy


def _choice(body: dict, tools: tuple[Tool, ...], legacy: bool) -> tuple[str, str | None]:
    param = "function_call" if legacy else "tool_choice"
    c = body.get(param)
    if legacy and body.get("tool_choice") is not None:
        raise bad_request("'tool_choice' goes with 'tools'; with 'functions' send "
                          "'function_call'", "tool_choice")
    if not legacy and body.get("function_call") is not None:
        raise bad_request("'function_call' goes with 'functions'; with 'tools' send "
                          "'tool_choice'", "function_call")
    if c is None:
        return ("auto" if tools else "none"), None
    if isinstance(c, str):
        if c not in ("none", "auto", "required") or (legacy and c == "required"):
            raise bad_request(f"'{param}' must be 'none', 'auto'"
                              f"{'' if legacy else ', required'} or a named function, got "
                              f"{c[:40]!r}", param)
        if c != "none" and not tools:
            raise bad_request(f"'{param}' is {c!r} but no tools were given", param)
        return c, None
    if not isinstance(c, dict):
        raise bad_request(f"'{param}' must be a string or an object, got {kind_of(c)}", param)
    if legacy:
        name = c.get("name")
    else:
        if c.get("type") != "function" or not isinstance(c.get("function"), dict):
            raise bad_request(f"'{param}' must be like {{\"type\": \"function\", \"function\": "
                              f"{{\"name\": ...}}}}", param)
        name = c["function"].get("name")
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        shown = name[:64] if isinstance(name, str) else kind_of(name)
        raise bad_request(f"'{param}' names function {shown!r}, which is not among the "
                          f"tools", param)
    return "named", name


def parse_tools(body: dict) -> ToolSpec | None:
    tools, legacy = _tools(body)
    choice, named = _choice(body, tools, legacy)
    parallel = boolean(body, "parallel_tool_calls", True)
    if not tools:
        return None
    return ToolSpec(tools, choice, named, legacy, parallel)
