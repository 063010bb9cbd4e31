"""The grammar of a forced tool choice ('required' or a named function): exactly one call in
the family's written form, its arguments constrained to the tool's JSON schema (closed to
unlisted properties when the function is `strict`, as response_format strict is), then EOS."""
from __future__ import annotations

import json

from ...structured.request import GrammarRequest, embedded_json
from ...tools.formats import ToolFormat
from ..response_format import closed
from .spec import Tool


def _lark_string(s: str) -> str:
    return json.dumps(s)        # a JSON string literal is a valid Lark string literal


def forced_call(fmt: ToolFormat, tools: tuple[Tool, ...]) -> GrammarRequest:
    alts = [{"type": "object", "properties": {"name": {"const": t.name},
                                              "arguments": closed(t.parameters) if t.strict
                                              else t.parameters},
             "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = alts[0] if len(alts) == 1 else {"anyOf": alts}
    source = (f"start: {_lark_string(fmt.call_prefix)} call {_lark_string(fmt.call_suffix)}\n"
              f"call: {embedded_json(schema)}\n")
    return GrammarRequest("lark", source, "tool_choice " + ",".join(t.name for t in tools))
