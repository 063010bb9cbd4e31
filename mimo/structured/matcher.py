"""One request's position in its grammar. Invariant: the matcher has consumed exactly the
request's output tokens (the decode step feeds it what the engine appends; drafts tried on
it are rolled back before the step ends)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .grammar import Grammar

log = logging.getLogger("mimo.structured")
_SHIFTS = torch.arange(32, dtype=torch.int32)


class TokenMatcher:
    def __init__(self, grammar: Grammar):
        from llguidance import LLMatcher
        self.grammar = grammar
        self._m = LLMatcher(grammar.vocab, grammar.source, log_level=0)
        self._words = (grammar.vocab.vocab_size + 31) // 32
        self._mask = torch.empty(self._words, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next (only EOS once it is complete)."""
        m = self._mask
        self._m.unsafe_compute_mask_ptr(m.data_ptr(), m.numel() * 4)
        bits = (m.unsqueeze(1) >> _SHIFTS) & 1
        return bits.reshape(-1).bool()

    def consume(self, tokens: list[int]) -> bool:
        ok = self._m.consume_tokens(list(tokens))
        if not ok:
            log.warning("grammar %s refused tokens %s: %s", self.grammar.description, tokens,
                        self._m.get_error())
        return ok

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar accepts from here (state unchanged)."""
        n = self._m.try_consume_tokens(list(tokens))
        if n:
            self._m.rollback(n)
        return n

    def rollback(self, n: int) -> None:
        if n:
            self._m.rollback(n)

    @property
    def done(self) -> bool:
        """Complete: nothing but EOS may follow."""
        return self._m.is_stopped()

    @property
    def error(self) -> str:
        return self._m.get_error() if self._m.is_error() else ""
