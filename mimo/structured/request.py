"""What a request asks its output to match, before it is compiled against a vocabulary
(compiling needs the model's tokenizer and takes milliseconds: the server does it off the
event loop)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from .grammar import Grammar
from .schema import bounded_schema


@dataclass(frozen=True)
class GrammarRequest:
    kind: str              # 'json_schema' | 'json_object' | 'lark'
    source: object         # the schema (dict) or the Lark text
    name: str = "schema"

    def compile(self, vocab) -> Grammar:
        if self.kind == "json_object":
            return Grammar.json_object(vocab)
        if self.kind == "json_schema":
            assert isinstance(self.source, dict)
            return Grammar.json_schema(self.source, vocab, self.name)
        assert isinstance(self.source, str)
        return Grammar.lark(self.source, vocab, self.name)


def embedded_json(schema: dict) -> str:
    """A JSON schema as a Lark `%json` item, bounded like the JSON grammars."""
    return "%json " + json.dumps(bounded_schema(schema))
