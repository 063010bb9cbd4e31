"""The tokenizer as llguidance sees it (token bytes, special tokens, EOS), built once per
mimo tokenizer: it walks the whole vocabulary (seconds for Gemma 3's 262k tokens)."""
from __future__ import annotations

import threading

_lock = threading.Lock()
_cache: dict[int, tuple[object, object]] = {}     # id(tokenizer) -> (tokenizer, LLTokenizer)


def grammar_vocab(tokenizer, vocab_size: int, eos_ids) -> object:
    """An llguidance LLTokenizer for `tokenizer` (mimo.models.tokenizer.Tokenizer: its
    `backend` is a `tokenizers.Tokenizer`) over the model's `vocab_size` logits; `eos_ids`:
    the tokens that end a request (allowed exactly when the grammar is complete)."""
    from llguidance import LLTokenizer
    with _lock:
        hit = _cache.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        eos = sorted(eos_ids) or [tokenizer.eos_token_id]
        vocab = LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        _cache[id(tokenizer)] = (tokenizer, vocab)
        return vocab
