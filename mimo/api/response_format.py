"""`response_format` -> the grammar the output is constrained to: `text` (none),
`json_object` (any JSON object) or `json_schema` ({"name", "schema", "strict",
"description"}: the schema, enforced whether or not `strict` is set, since grammar-constrained
decoding costs nothing extra; objects are closed where `additionalProperties` is unsaid either
way: mimo.structured.schema). Errors name `response_format`."""
from __future__ import annotations

import re

from ..structured.request import GrammarRequest
from ..structured.schema import closed
from .errors import bad_request
from .fields import kind_of

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
P = "response_format"


def parse_response_format(body: dict) -> tuple[GrammarRequest | None, str | None]:
    rf = body.get(P)
    if rf is None:
        return None, None
    if not isinstance(rf, dict):
        raise bad_request(f"'{P}' must be an object, got {kind_of(rf)}", P)
    t = rf.get("type")
    if t == "text":
        return None, None
    if t == "json_object":
        return GrammarRequest("json_object", {"type": "object"}, "json_object"), t
    if t != "json_schema":
        shown = t[:40] if isinstance(t, str) else kind_of(t)
        raise bad_request(f"'{P}.type' must be 'text', 'json_object' or 'json_schema', got "
                          f"{shown!r}", P)
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad_request(f"'{P}.json_schema' must be an object with 'name' and 'schema'", P)
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"'{P}.json_schema.name' must be 1-64 characters of a-z, A-Z, 0-9, "
                          f"_ and -", P)
    schema = js.get("schema", {})
    if not isinstance(schema, dict):
        raise bad_request(f"'{P}.json_schema.schema' must be a JSON schema object, got "
                          f"{kind_of(schema)}", P)
    if "strict" in js and js["strict"] is not None and not isinstance(js["strict"], bool):
        raise bad_request(f"'{P}.json_schema.strict' must be a boolean", P)
    if "description" in js and not isinstance(js["description"], (str, type(None))):
        raise bad_request(f"'{P}.json_schema.description' must be a string", P)
    return GrammarRequest("json_schema", schema, name), t


__all__ = ["closed", "parse_response_format"]
