"""Grammar-constrained decoding (structured outputs), on llguidance (a maintained CPU
library: the token masks are computed by its Rust core, a fraction of a millisecond per
token). A `Grammar` is what `SamplingParams.constraint` holds; the decode step makes one
`TokenMatcher` per request from it, masks each position's logits with `allowed()` and
advances it with the tokens the engine keeps.

Every JSON grammar goes through `bounded_schema` (closed objects, bounded numbers and
whitespace: schema.py); an API asking for a JSON schema makes a
`GrammarRequest("json_schema", schema, name)` and the server compiles it off the loop."""
from .grammar import Grammar, GrammarError
from .matcher import TokenMatcher
from .request import GrammarRequest
from .schema import bounded_schema, closed
from .vocab import grammar_vocab

__all__ = ["Grammar", "GrammarError", "GrammarRequest", "TokenMatcher", "bounded_schema",
           "closed", "grammar_vocab"]
