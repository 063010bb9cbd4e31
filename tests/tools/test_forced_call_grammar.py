"""The grammar of a forced call in each written form (mimo/api/tools/grammar.py), checked
with llguidance against a real tokenizer's vocabulary: calls written in the family's form
(ToolFormat.write) are accepted whole, and random walks through the grammar (a uniformly
random allowed token at every step, until it ends) always come out as one call that the
family's own parser reads back with arguments valid against the tool's schema."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from mimo.api.tools.grammar import forced_call
from mimo.api.tools.spec import Tool
from mimo.structured import grammar_vocab
from mimo.tools import FORMATS, OutputParser

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
    "required": ["city", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 20},
                                           "exact": {"type": "boolean"}},
          "required": ["query"], "additionalProperties": False}
TOOLS = (Tool("get_weather", "", WEATHER), Tool("search", "", SEARCH, strict=True))
SCHEMAS = {t.name: t.parameters for t in TOOLS}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    from mimo import LLM
    from mimo.models.tiny import gemma3
    d = tmp_path_factory.mktemp("tiny_forced_grammar")
    gemma3.write(d, seed=1)
    llm = LLM(str(d), progress=False, dtype="float32", kv_cache_memory="8MiB")
    tok = llm.tokenizer
    return tok, grammar_vocab(tok, llm.engine.model_config.vocab_size, llm.engine.eos_ids), \
        llm.engine.eos_ids


def _parse(fmt, text):
    p = OutputParser(fmt, tools=True, reasoning=False, schemas=SCHEMAS)
    p.feed(text)
    p.finish()
    return p.out.calls


@pytest.mark.parametrize("family", ["mimo", "hermes"])
def test_written_calls_are_accepted(vocab, family):
    tok, v, _ = vocab
    fmt = FORMATS[family]
    m = forced_call(fmt, TOOLS).compile(v).matcher()
    args = {"city": "Paris", "unit": "celsius", "days": 3}
    text = fmt.write("get_weather", args)
    if family == "hermes":      # the grammar's JSON is compact (write's has spaces)
        body = json.dumps({"name": "get_weather", "arguments": args}, separators=(",", ":"))
        text = fmt.call_prefix + body + fmt.call_suffix
    assert m.consume(tok.encode(text, add_special_tokens=False))
    assert m.done
    assert _parse(fmt, text)[0].name == "get_weather"


@pytest.mark.parametrize("family", ["mimo", "hermes"])
@pytest.mark.parametrize("seed", range(12))
def test_random_walks_parse_into_valid_calls(vocab, family, seed):
    tok, v, eos = vocab
    fmt = FORMATS[family]
    m = forced_call(fmt, TOOLS).compile(v).matcher()
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(400):
        if m.done:
            break
        allowed = torch.nonzero(m.allowed()).squeeze(1).tolist()
        allowed = [t for t in allowed if t not in eos] or allowed
        t = rng.choice(allowed)
        assert m.consume([t])
        out.append(t)
    assert m.done, "the walk did not end within 400 tokens"
    text = tok.decode(out)
    calls = _parse(fmt, text)
    assert calls is not None and len(calls) == 1, text
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, SCHEMAS[calls[0].name])
    if family == "mimo":
        assert "<function=" in text and '"arguments"' not in text


# Pydantic writes nested models as definitions: `$defs` beside the properties and `$ref`s to
# them, which must resolve inside the call (its arguments are not the document's root).
DEFS = {"type": "object", "$defs": {
    "Unit": {"enum": ["C", "F"]},
    "Place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                               "unit": {"$ref": "#/$defs/Unit"}},
              "required": ["city", "unit"]}},
    "properties": {"place": {"$ref": "#/$defs/Place"},
                   "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["place", "days"]}
DEF_TOOLS = (Tool("forecast", "", DEFS), Tool("search", "", SEARCH))


@pytest.mark.parametrize("family", ["mimo", "hermes"])
@pytest.mark.parametrize("seed", range(4))
def test_tools_with_definitions(vocab, family, seed):
    tok, v, eos = vocab
    fmt = FORMATS[family]
    args = {"place": {"city": "Oslo", "unit": "C"}, "days": 2}
    m = forced_call(fmt, DEF_TOOLS).compile(v).matcher()
    body = json.dumps({"name": "forecast", "arguments": args}, separators=(",", ":"))
    text = (fmt.call_prefix + body + fmt.call_suffix if family == "hermes"
            else fmt.write("forecast", args))
    assert m.consume(tok.encode(text, add_special_tokens=False)) and m.done
    m = forced_call(fmt, DEF_TOOLS).compile(v).matcher()
    rng = random.Random(seed)
    out: list[int] = []
    while not m.done and len(out) < 400:
        allowed = torch.nonzero(m.allowed()).squeeze(1).tolist()
        t = rng.choice([t for t in allowed if t not in eos] or allowed)
        assert m.consume([t])
        out.append(t)
    assert m.done, tok.decode(out)
    p = OutputParser(fmt, tools=True, reasoning=False,
                     schemas={t.name: t.parameters for t in DEF_TOOLS})
    p.feed(tok.decode(out))
    p.finish()
    (call,) = p.out.calls
    jsonschema.validate(json.loads(call.arguments), {t.name: t.parameters
                                                     for t in DEF_TOOLS}[call.name])
