"""One request's position in its grammar. Invariant: the matcher has consumed exactly the
request's output tokens (the decode step feeds it what the engine appends; drafts tried on
it are rolled back before the step ends)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .grammar import Grammar

log = logging.getLogger("mimo.structured")

_executor = None        # llguidance's mask thread pool, shared by every request (made on first use)


def batch_allowed(matchers: list[TokenMatcher]) -> torch.Tensor:
    """bool [len(matchers), vocab]: each matcher's `allowed()`, computed in one call on
    llguidance's own threads (it releases the GIL, so this may run beside a forward)."""
    global _executor
    if _executor is None:
        from llguidance import LLExecutor
        _executor = LLExecutor()
    V = matchers[0]._vocab
    assert all(m._vocab == V for m in matchers), "one model's vocabulary per batch"
    words = (V + 31) // 32
    mask = np.empty((len(matchers), words), dtype=np.int32)
    _executor.unsafe_compute_mask_ptr([(m._m, i) for i, m in enumerate(matchers)],
                                      mask.ctypes.data, words * 4, len(matchers))
    bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, :V]
    return torch.from_numpy(bits.view(np.bool_))


class TokenMatcher:
    def __init__(self, grammar: Grammar):
        from llguidance import LLMatcher
        self.grammar = grammar
        self._m = LLMatcher(grammar.vocab, grammar.source, log_level=0)
        self._vocab = grammar.vocab.vocab_size
        self._mask = np.empty((self._vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> torch.Tensor:
        """bool [vocab]: the tokens the grammar allows next (only EOS once it is complete)."""
        m = self._mask
        self._m.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)
        # Bit i of word j is token 32 j + i; little-endian words, so unpack little-endian bytes.
        bits = np.unpackbits(m.view(np.uint8), bitorder="little")[:self._vocab]
        return torch.from_numpy(bits.view(np.bool_))

    def consume(self, tokens: list[int]) -> bool:
        """Advance by `tokens`; once the grammar is complete the rest (the EOS that ends the
        request) is not fed to it."""
        ok = True
        for t in tokens:
            if self._m.is_stopped():
                break
            ok = self._m.consume_token(t)
            if not ok:
                break
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

    @property
    def forced(self) -> bool:
        """The grammar forces the next bytes (or is complete): its mask keeps only their
        canonical tokens (or EOS)."""
        return self._m.is_stopped() or bool(self._m.compute_ff_bytes())

    def takes_freely(self, token: int) -> bool:
        """Whether `token` is in the mask `allowed()` would compute, without computing it:
        the grammar accepts it here and forces no bytes here (where it forces bytes, the
        mask keeps only their canonical tokens, stricter than what the grammar accepts)."""
        return not self.forced and self.valid_prefix([token]) == 1

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
