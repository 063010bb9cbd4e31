"""The JSON schema a grammar enforces: the client's schema made to end, as XGrammar and
llama.cpp make theirs. `bounded_schema` is the one entry point; every JSON grammar (a
`json_schema` response format, `json_object`, a forced tool call's arguments, the Responses
API's structured outputs) is compiled from its result, so they all end the same way.

- Objects are closed to their listed properties where the schema leaves
  `additionalProperties` unsaid (XGrammar's default, and OpenAI's strict mode): a small model
  given an open object invents keys until `max_tokens`. A property that `required` names but
  `properties` does not list is listed (any value), so closing never makes a schema
  unsatisfiable. `additionalProperties: true` or a schema keeps the object open. Objects
  merged by a multi-branch `allOf` (and the definitions such an `allOf` refers to) are left
  as said: closing one branch would refuse the other branches' properties.
- Integers and numbers without bounds get +-(2^53 - 1), the largest integers JSON
  parsers read exactly (16 digits; llama.cpp's grammar allows 16 integer digits too), and
  numbers without `multipleOf` at most 10 fraction digits (`multipleOf: 1e-10`: llguidance
  takes no finer decimal; a bounded number is written without an exponent). Without them
  a model may write a 90-digit integer until `max_tokens` cuts the document.
- Values the schema leaves free (`true`, `{}`, `additionalProperties: true`, array items
  unsaid) take `ANY`: any JSON value, with numbers bounded as above.
- Whitespace is at most one space at each place JSON allows it (`JSON_OPTIONS`): free
  whitespace lets a base model emit newlines forever inside a valid prefix, and even
  bounded newlines and indentation (llama.cpp allows 2 and 20) spend a line's token or
  two on every key of a pretty-printed document, which the default model writes when
  allowed; one space keeps the `{"a": 1, "b": 2}` layout models are used to.

Strings stay unbounded unless the schema bounds them (neither anchor bounds them).
The result only narrows the schema: every document it accepts the client's schema accepts.
"""
from __future__ import annotations

from typing import Any

MAX_INT = 2**53 - 1            # |integer| bound where the schema sets none
FRACTION = 1e-10               # the finest decimal step of a number without `multipleOf`
# llguidance matches this at most once at each place JSON allows whitespace.
WHITESPACE = r"[ ]"
JSON_OPTIONS = {"whitespace_pattern": WHITESPACE}
ANY_NAME = "mimo_any"
ANY_REF = f"#/$defs/{ANY_NAME}"
ANY: dict = {"anyOf": [
    {"type": "null"}, {"type": "boolean"}, {"type": "string"},
    {"type": "number", "minimum": -MAX_INT, "maximum": MAX_INT, "multipleOf": FRACTION},
    {"type": "array", "items": {"$ref": ANY_REF}},
    {"type": "object", "additionalProperties": {"$ref": ANY_REF}},
]}

# Where subschemas sit. Value places hold what the model writes; an `allOf` branch is
# intersected with its siblings; condition places (`not`, `if`, `contains`, ...) are left as
# said, since narrowing a condition can widen what the schema accepts.
_VALUE_MAPS = ("properties", "patternProperties")
_VALUE_SUBS = ("items", "additionalItems", "additionalProperties")
_VALUE_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_DEFS = ("$defs", "definitions")
# Keywords that restrict a value's type: a schema with none of them takes any value.
_TYPED = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if")
_WORDS = {"object": ("properties", "required", "patternProperties", "additionalProperties",
                     "minProperties", "maxProperties", "propertyNames", "dependentRequired"),
          "array": ("items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems"),
          "string": ("minLength", "maxLength", "pattern", "format"),
          "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                     "multipleOf")}


def bounded_schema(schema: Any) -> Any:
    """The schema the grammar enforces for `schema` (see the module's doc), with the
    whitespace options llguidance reads at its top (`x-guidance`)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        return schema       # `false` and non-schemas: llguidance's error names them
    out = _bound(closed(schema))
    out["$defs"] = {**(out.get("$defs") or {}), ANY_NAME: ANY}
    out["x-guidance"] = {**(schema.get("x-guidance") or {}), **JSON_OPTIONS}
    return out


def closed(schema: Any) -> Any:
    """Every object closed to its listed properties where `additionalProperties` is
    unsaid (OpenAI's strict mode; also what a strict tool's arguments are checked with)."""
    if not isinstance(schema, dict):
        return schema
    return _close(schema, _merged_refs(schema), True, "#")


def _types(s: dict) -> set:
    t = s.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if any(k in s for k in _TYPED):
        return set()
    # No type said: the keywords present say which kinds the model will write.
    return {kind for kind, words in _WORDS.items() if any(k in s for k in words)}


def _map_places(s: dict, value, branch, alt=None) -> dict:
    """`s` with `value` applied to its subschemas in value places (`alt`, when given, to
    its `anyOf` / `oneOf` branches) and `branch` to its `allOf` branches (definitions and
    condition places untouched)."""
    out = dict(s)
    for k in _VALUE_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: value(v) for name, v in out[k].items()}
    for k in _VALUE_SUBS:
        if isinstance(out.get(k), (dict, bool)):
            out[k] = value(out[k])
    for k in _VALUE_LISTS:
        if isinstance(out.get(k), list):
            f = alt if alt is not None and k in ("anyOf", "oneOf") else value
            out[k] = [f(v) for v in out[k]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [branch(v) for v in out["allOf"]]
    return out


def _merged_refs(schema: dict) -> set:
    """The `$ref`s that a multi-branch `allOf` merges: their objects are not closed."""
    found: set = set()

    def walk(s):
        if isinstance(s, dict):
            branches = s.get("allOf")
            if isinstance(branches, list) and len(branches) > 1:
                found.update(b["$ref"] for b in branches
                             if isinstance(b, dict) and isinstance(b.get("$ref"), str))
            for k in _DEFS:
                if isinstance(s.get(k), dict):
                    for v in s[k].values():
                        walk(v)
            _map_places(s, walk, walk)
        return s
    walk(schema)
    return found


def _close(s: Any, merged: set, may_close: bool, path: str = "") -> Any:
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for k in _DEFS:
        if isinstance(out.get(k), dict):
            out[k] = {n: _close(v, merged, f"{path}/{k}/{n}" not in merged, f"{path}/{k}/{n}")
                      for n, v in out[k].items()}
    # One allOf branch is the schema; several are an intersection, and where the schema
    # lists properties itself its anyOf / oneOf branches constrain them: those branches'
    # own objects stay as said (their subschemas are still closed).
    multi = isinstance(s.get("allOf"), list) and len(s["allOf"]) > 1
    own = "properties" in s or "patternProperties" in s
    out = _map_places(out, lambda v: _close(v, merged, True),
                      lambda v: _close(v, merged, not multi),
                      lambda v: _close(v, merged, not own))
    if may_close and "object" in _types(s) and "additionalProperties" not in s and not (
            multi or "$ref" in s or "unevaluatedProperties" in s):
        props = dict(out.get("properties") or {})
        for name in out.get("required") or []:
            if isinstance(name, str) and name not in props:
                props[name] = True
        if props or "properties" in out:
            out["properties"] = props
        out["additionalProperties"] = False
    return out


def _bound(s: Any, value: bool = True) -> Any:
    """Free values -> ANY (in value places), numbers bounded (also in `allOf` branches)."""
    if value and (s is True or s == {}):
        return {"$ref": ANY_REF}
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for k in _DEFS:
        if isinstance(out.get(k), dict):
            out[k] = {n: _bound(v) for n, v in out[k].items()}
    out = _map_places(out, _bound, lambda v: _bound(v, value=False))
    types = _types(s)
    if value and not types and not any(k in s for k in _TYPED):
        out["$ref"] = ANY_REF            # any value, bounded (its other words still apply)
    if types & {"integer", "number"}:
        if not any(k in s for k in ("minimum", "exclusiveMinimum")):
            out["minimum"] = min(-MAX_INT, _num(s.get("maximum")) - MAX_INT)
        if not any(k in s for k in ("maximum", "exclusiveMaximum")):
            out["maximum"] = max(MAX_INT, _num(s.get("minimum")) + MAX_INT)
        if "number" in types and "multipleOf" not in s:
            out["multipleOf"] = FRACTION
    return out


def _num(v: Any) -> float:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def nested(schema: Any, prefix: str) -> tuple[Any, dict]:
    """`schema` made to sit inside another document (a forced call's `arguments`): its
    `$defs` / `definitions` returned renamed under `prefix`, for the outer document's
    `$defs`, and its local `$ref`s (`#`, `#/$defs/...`, `#/definitions/...`) rewritten to
    them; without this they would resolve against the outer document's root."""
    if not isinstance(schema, dict):
        return schema, {}
    names = {f"#/{kind}/{n}": f"#/$defs/{prefix}{kind.strip('$')}_{n}"
             for kind in _DEFS if isinstance(schema.get(kind), dict) for n in schema[kind]}
    root = f"#/$defs/{prefix}root"
    used_root = False

    def ref(r: str) -> str:
        nonlocal used_root
        if r == "#":
            used_root = True
            return root
        for old, new in names.items():
            if r == old or r.startswith(old + "/"):
                return new + r[len(old):]
        return r

    def rewrite(node: Any, top: bool = False) -> Any:
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: rewrite(v) for k, v in node.items() if not (top and k in _DEFS)}
        if isinstance(node.get("$ref"), str):
            out["$ref"] = ref(node["$ref"])
        return out

    body = rewrite(schema, top=True)
    defs = {names[f"#/{kind}/{n}"][len("#/$defs/"):]: rewrite(v)
            for kind in _DEFS if isinstance(schema.get(kind), dict)
            for n, v in schema[kind].items()}
    if used_root:
        defs[root[len("#/$defs/"):]] = body
    return body, defs
