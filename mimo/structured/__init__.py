"""Grammar-constrained decoding (structured outputs), on llguidance (a maintained CPU
library: the token masks are computed by its Rust core, a fraction of a millisecond per
token). A `Grammar` is what `SamplingParams.constraint` holds; the decode step makes one
`TokenMatcher` per request from it, masks each position's logits with `allowed()` and
advances it with the tokens the engine keeps."""
from .grammar import Grammar, GrammarError
from .matcher import TokenMatcher
from .vocab import grammar_vocab

__all__ = ["Grammar", "GrammarError", "TokenMatcher", "grammar_vocab"]
