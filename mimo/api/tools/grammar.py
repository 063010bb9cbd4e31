"""The grammar of a forced tool choice ('required' or a named function): exactly one call in
the family's written form, its arguments constrained to the tool's JSON schema (closed to
unlisted properties where it leaves `additionalProperties` unsaid, strict or not, as every
JSON grammar is: mimo.structured.schema), then EOS.

Two written forms (`ToolFormat.args`):
- "json": `{"name": ..., "arguments": {...}}` between the format's call markers (Hermes);
- "xml": MiMo-V2-Flash's `<function=NAME>` with one `<parameter=KEY>` block per argument,
  required ones in the schema's order, then the optional ones, each optional. A string
  argument is raw text (as the parser reads it back: mimo/tools/formats.py) without "</",
  and without "<" at all when it has a maxLength (which then counts characters exactly),
  or one of its enum / const values; `pattern` and `format` are not enforced in this form.
  Any other argument is JSON constrained by its own schema.
"""
from __future__ import annotations

import json

from ...structured.request import GrammarRequest, embedded_json
from ...structured.schema import nested
from ...tools.formats import ToolFormat
from .spec import Tool


def _lit(s: str) -> str:
    return json.dumps(s)        # a JSON string literal is a valid Lark string literal


def forced_call(fmt: ToolFormat, tools: tuple[Tool, ...]) -> GrammarRequest:
    body = _xml_calls(tools) if fmt.args == "xml" else _json_call(tools)
    source = f"start: {_lit(fmt.call_prefix)} call {_lit(fmt.call_suffix)}\n{body}"
    return GrammarRequest("lark", source, "tool_choice " + ",".join(t.name for t in tools))


def _json_call(tools: tuple[Tool, ...]) -> str:
    alts, defs = [], {}
    for i, t in enumerate(tools):
        # The arguments sit inside the call object: their own definitions move to its root.
        args, own = nested(t.parameters, f"f{i}_")
        defs.update(own)
        alts.append({"type": "object", "properties": {"name": {"const": t.name},
                                                      "arguments": args},
                     "required": ["name", "arguments"], "additionalProperties": False})
    schema: dict = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if defs:
        schema = {**schema, "$defs": defs}
    return f"call: {embedded_json(schema)}\n"


_END = "\n</parameter>"


def _xml_calls(tools: tuple[Tool, ...]) -> str:
    rules = ["call: " + " | ".join(f"f{i}" for i in range(len(tools)))]
    for i, t in enumerate(tools):
        props = t.parameters.get("properties") or {}
        # Each value is its own JSON document: the tool's definitions go with it.
        defs = {k: t.parameters[k] for k in ("$defs", "definitions") if k in t.parameters}
        required = [k for k in t.parameters.get("required") or [] if k in props]
        optional = [k for k in props if k not in required]
        parts = []
        for j, key in enumerate(required + optional):
            parts.append(f"p{i}_{j}" + ("?" if key in optional else ""))
            rules.append(f"p{i}_{j}: {_lit(f'<parameter={key}>' + chr(10))} v{i}_{j} \"\\n\"")
            rules.append(_value_rule(f"v{i}_{j}", props[key], defs))
        rules.append(f"f{i}: {_lit(f'<function={t.name}>' + chr(10))} {' '.join(parts)} "
                     f"\"</function>\"")
    return "\n".join(rules) + "\n"


def _value_rule(name: str, schema: dict, defs: dict) -> str:
    """One argument's value and the `</parameter>` that closes it."""
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if choices is not None:
        vals = [c if isinstance(c, str) else json.dumps(c) for c in choices]
        return f"{name}: ({' | '.join(_lit(v) for v in vals)}) {_lit(_END)}"
    if schema.get("type") == "string":
        # One lexeme for the text and its closing tag. The text never holds "</" (so the
        # first "</" is the tag's); bounded, it holds no "<" at all, so that the bound
        # counts characters.
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        if hi is not None:
            text = f"[^<]{{{lo},{int(hi)}}}"
        else:
            text = "([^<]|<[^/])" + (f"{{{lo},}}" if lo else "*")
        return f"{name}: {name.upper()}\n{name.upper()}: /{text}\\n<\\/parameter>/"
    return f"{name}: {embedded_json({**schema, **defs})} {_lit(_END)}"
