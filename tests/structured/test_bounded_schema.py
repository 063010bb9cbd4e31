"""The grammar every JSON schema is compiled through (mimo/structured/schema.py), checked with
llguidance against a real tokenizer's vocabulary: objects closed where `additionalProperties`
is unsaid, integers and numbers bounded, whitespace at most one space; schemas that open
them stay open; closing never makes a satisfiable schema unsatisfiable. Every document the
grammar accepts is checked against the client's own schema with jsonschema (an independent
validator): the grammar only narrows it. Random walks (a uniformly random allowed token at
every step) through schemas with unbounded numbers and open-by-omission objects always end,
and their documents validate and stay within the bounds."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

from mimo.structured import Grammar, bounded_schema, closed, grammar_vocab
from mimo.structured.schema import nested

NESTED = {"type": "object", "properties": {
    "a": {"type": "integer"},
    "b": {"type": "object", "properties": {"c": {"type": "number"}}}}}
OPEN = {"type": "object", "properties": {"a": {"type": "integer"}},
        "additionalProperties": True}
MAP = {"type": "object", "additionalProperties": {"type": "integer"}}
REQUIRED_UNLISTED = {"type": "object", "properties": {"a": {"type": "integer"}},
                     "required": ["a", "z"]}
MERGED = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                    {"type": "object", "properties": {"b": {"type": "integer"}}}]}
MERGED_REFS = {"$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}}},
               "allOf": [{"$ref": "#/$defs/A"},
                         {"type": "object", "properties": {"b": {"type": "integer"}}}]}
ONE_OF_KEYS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
               "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
NULLABLE = {"type": "object", "properties": {"p": {"anyOf": [
    {"type": "object", "properties": {"x": {"type": "integer"}}}, {"type": "null"}]}}}
FREE = {"type": "object", "properties": {"v": {}, "w": True}}
BIG = 2**53 - 1

CASES = [
    # (schema, document, whether the grammar takes it)
    (NESTED, '{"a":1,"b":{"c":2.5}}', True),
    (NESTED, '{"a": 1, "b": {"c": -0.125}}', True),
    (NESTED, '{"a":1,"z":2}', False),                        # closed by default
    (NESTED, '{"a":1,"b":{"c":2,"d":3}}', False),            # nested objects too
    (NESTED, f'{{"a":{BIG}}}', True),
    (NESTED, f'{{"a":-{BIG}}}', True),
    (NESTED, '{"a":' + "1" * 17 + "}", False),               # integers: 16 digits
    (NESTED, '{"b":{"c":0.' + "1" * 10 + "}}", True),
    (NESTED, '{"b":{"c":0.' + "1" * 11 + "}}", False),       # fractions: 10 digits
    (NESTED, '{"b":{"c":1.5' + "0" * 10 + "}}", False),     # zeros count too
    (NESTED, '{"b":{"c":' + "9" * 17 + "}}", False),
    (NESTED, '{"a":  1}', False),                            # at most one space
    (NESTED, '{\n"a":1}', False),
    (OPEN, '{"a":1,"z":[1,{"q":null}],"y":"s"}', True),       # opened by the schema
    (OPEN, '{"z":' + "1" * 17 + "}", False),                 # its free values bounded
    (MAP, '{"x":1,"y":2}', True),
    (MAP, '{"x":"s"}', False),
    (REQUIRED_UNLISTED, '{"a":1,"z":{"k":true}}', True),     # listed, not made unsatisfiable
    (REQUIRED_UNLISTED, '{"a":1,"z":1,"q":2}', False),
    (MERGED, '{"a":1,"b":2}', True),                         # allOf branches stay open
    (MERGED_REFS, '{"a":1,"b":2}', True),
    (ONE_OF_KEYS, '{"b":"x"}', True),
    (ONE_OF_KEYS, '{"a":1,"c":1}', False),
    (NULLABLE, '{"p":{"x":3}}', True),
    (NULLABLE, '{"p":{"x":3,"y":4}}', False),                # anyOf alternatives closed
    (NULLABLE, '{"p":null}', True),
    (FREE, '{"v":[true,"s",{"k":-2.5}],"w":{}}', True),
    (FREE, '{"v":{"k":' + "2" * 17 + "}}", False),
    ({}, '[1, "a", {"b": null}]', True),
    ({}, "1" * 17, False),
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    from mimo.models.tiny import gemma3
    from mimo.models.tokenizer import Tokenizer
    d = tmp_path_factory.mktemp("tiny_bounded_schema")
    gemma3.write(d, seed=1)
    tok = Tokenizer.from_hf_dir(d)
    n = json.loads((d / "config.json").read_text())["vocab_size"]
    return tok, grammar_vocab(tok, n, {tok.eos_token_id})


def takes(vocab, schema, text: str) -> bool:
    tok, v = vocab
    m = Grammar.json_schema(schema, v).matcher()
    ids = tok.encode(text, add_special_tokens=False)
    return m.valid_prefix(ids) == len(ids) and m.consume(ids) and m._m.is_accepting()


@pytest.mark.parametrize("schema, text, expected", CASES)
def test_the_grammar_takes_what_the_rules_say(vocab, schema, text, expected):
    assert takes(vocab, schema, text) == expected
    if expected:    # only narrows: the client's schema takes it too
        jsonschema.validate(json.loads(text), schema)


def test_json_object_is_open_but_bounded(vocab):
    tok, v = vocab
    for text, ok in [('{"k":[1,{"z":null}],"s":"x"}', True), ('{"k":' + "3" * 17 + "}", False),
                     ("[1]", False)]:
        m = Grammar.json_object(v).matcher()
        ids = tok.encode(text, add_special_tokens=False)
        assert (m.valid_prefix(ids) == len(ids) and m.consume(ids)
                and m._m.is_accepting()) == ok, text


def test_the_client_schema_is_not_changed():
    s = json.loads(json.dumps(NULLABLE))
    bounded_schema(s)
    closed(s)
    assert s == NULLABLE


def test_explicit_choices_are_kept():
    s = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5},
                                          "x": {"type": "number", "multipleOf": 0.5}},
         "additionalProperties": {"type": "string"}}
    b = bounded_schema(s)
    assert b["additionalProperties"] == {"type": "string"}
    assert b["properties"]["n"]["minimum"] == 5 and b["properties"]["n"]["maximum"] >= BIG
    assert b["properties"]["x"]["multipleOf"] == 0.5


WALKED = [
    NESTED,
    {"type": "object", "properties": {
        "id": {"type": "integer"}, "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "owner": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer",
                                                               "minimum": 0}}},
        "kind": {"enum": ["a", "b"]}}, "required": ["id", "owner"]},
    {"type": "object", "properties": {"p": {"anyOf": [
        {"type": "object", "properties": {"x": {"type": "number"}}}, {"type": "null"}]}},
     "required": ["p"]},
]


def _walk(vocab, schema, seed: int) -> str:
    tok, v = vocab
    m = Grammar.json_schema(schema, v).matcher()
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(600):
        allowed = torch.nonzero(m.allowed()).squeeze(1).tolist()
        if allowed == [tok.eos_token_id]:
            return tok.decode(out)
        t = rng.choice([t for t in allowed if t != tok.eos_token_id])
        assert m.consume([t])
        out.append(t)
    raise AssertionError(f"no end within 600 tokens: {tok.decode(out)!r}")


def _unlisted(value, schema) -> list:
    """Keys of `value`'s objects that their schema (or its anyOf alternatives) does not list."""
    if isinstance(value, dict):
        props = dict(schema.get("properties", {}))
        for alt in schema.get("anyOf", []):
            props.update(alt.get("properties", {}))
        return [k for k in value if k not in props] + [
            x for k, v in value.items() if k in props for x in _unlisted(v, props[k])]
    if isinstance(value, list):
        return [x for v in value for x in _unlisted(v, schema.get("items", {}))]
    return []


def _outside_strings(text: str) -> str:
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


@pytest.mark.parametrize("i", range(len(WALKED)))
@pytest.mark.parametrize("seed", range(6))
def test_random_walks_end_within_the_bounds(vocab, i, seed):
    schema = WALKED[i]
    text = _walk(vocab, schema, seed)
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert not _unlisted(value, schema), value
    bare = _outside_strings(text)
    assert "  " not in bare and "\n" not in bare and "\t" not in bare, text
    for num in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", bare):
        whole, _, frac = num.lstrip("-").partition(".")
        assert len(whole) <= 16 and len(frac) <= 10 and "e" not in num.lower(), num


def test_a_schema_nested_in_another_keeps_its_references(vocab):
    tree = {"type": "object", "definitions": {"Leaf": {"enum": [1, 2]}},
            "properties": {"v": {"$ref": "#/definitions/Leaf"},
                           "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
            "required": ["v"]}
    body, defs = nested(tree, "t_")
    outer = {"type": "object", "properties": {"a": body}, "required": ["a"], "$defs": defs}
    doc = '{"a":{"v":1,"kids":[{"v":2,"kids":[]},{"v":1}]}}'
    assert takes(vocab, outer, doc)
    jsonschema.validate(json.loads(doc)["a"], tree)
    assert not takes(vocab, outer, '{"a":{"v":3}}')
