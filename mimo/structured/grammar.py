"""A compiled grammar request: JSON schema or any JSON object, checked against the
vocabulary when made (a schema llguidance cannot compile is the client's error)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .matcher import TokenMatcher
from .schema import JSON_OPTIONS, bounded_schema


class GrammarError(ValueError):
    """A schema or grammar that cannot be compiled (or is not supported)."""


@dataclass(frozen=True, eq=False)
class Grammar:
    source: str          # llguidance's grammar (JSON-serialised)
    vocab: Any           # llguidance.LLTokenizer
    description: str     # for logs: 'json_schema <name>', 'json_object'

    @classmethod
    def json_schema(cls, schema: dict, vocab, name: str = "schema") -> Grammar:
        """`schema` as `bounded_schema` makes it: closed objects, bounded numbers and
        whitespace (mimo/structured/schema.py)."""
        from llguidance import LLMatcher
        try:
            source = LLMatcher.grammar_from_json_schema(json.dumps(bounded_schema(schema)),
                                                        defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"JSON schema {name!r} is not valid: {e}") from None
        return cls._checked(source, vocab, f"json_schema {name}")

    @classmethod
    def json_object(cls, vocab) -> Grammar:
        """Any JSON object (open: the client asked for no schema)."""
        return cls.json_schema({"type": "object", "additionalProperties": True}, vocab,
                               "json_object")

    @classmethod
    def lark(cls, source: str, vocab, description: str = "lark") -> Grammar:
        """A Lark grammar (llguidance's dialect: `%json {schema}` embeds a JSON schema)."""
        from llguidance import LLMatcher
        return cls._checked(LLMatcher.grammar_from_lark(source), vocab, description)

    @classmethod
    def _checked(cls, source: str, vocab, description: str) -> Grammar:
        from llguidance import LLMatcher
        bad, msgs = LLMatcher.validate_grammar_with_warnings(source, vocab)
        if bad:
            raise GrammarError(f"{description}: {msgs[0] if msgs else 'invalid'}")
        return cls(source, vocab, description)

    def matcher(self) -> TokenMatcher:
        return TokenMatcher(self)
